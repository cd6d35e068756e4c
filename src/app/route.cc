// `basalt route`: the gateway over `basalt serve` replicas (router/, and
// docs/ROUTER.md for the plan it grows along).
//
// Lifecycle: the replica list is read and checked first (a bad line fails
// the command), the port is bound, and a `listening` then a `ready` line are
// logged. SIGHUP re-reads --replica-file (with the --replica flags): a good
// list replaces the old one (replicas no longer listed drain: their
// requests in flight finish), a bad one is logged and the old list kept.
// --replica-dns HOST:PORT adds every address HOST resolves to, resolved
// again every --dns-interval on a thread of its own and diffed against the
// list the same way (router/dns_discovery.h).
// SIGTERM or SIGINT stops accepting, lets forwarded requests finish until
// --drain-timeout, then closes every connection; a second signal skips the
// wait.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <fmt/format.h>
#include <pthread.h>
#include <string>
#include <thread>
#include <vector>

#include "app/commands.h"
#include "app/http_flags.h"
#include "core/error.h"
#include "core/log.h"
#include "router/autoscaler.h"
#include "router/dns_discovery.h"
#include "router/replica_registry.h"
#include "router/route_server.h"
#include "router/placement.h"
#include "router/tenants.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"
#include "workflow/definition.h"
#include "workflow/service.h"

namespace basalt {
namespace {

struct RouteFlags {
  HttpFlags http;
  std::string policy = "cache-aware";
  std::string session_header = "x-session-id";
  std::vector<std::string> replicas;
  std::string replica_file;
  std::vector<std::string> replica_dns;
  double dns_interval = 5;
  std::string tenants_file;
  std::string upstream_api_key;
  int max_attempts = 3;
  int max_failovers = 2;
  double stall_timeout = 10;
  double health_interval = 2;
  double health_timeout = 1;
  double metrics_interval = 1;
  double upstream_timeout = 600;
  int client_threads = 2;
  double drain_timeout = 30;
  std::string home_pool;
  double assumed_prefill_rate = 2000;
  std::vector<std::string> tokenizers;
  int tokenizer_threads = 2;
  // Each replica's circuit breaker (router/circuit_breaker.h).
  int breaker_failures = 5;
  double breaker_open_seconds = 10;
  int breaker_half_open_successes = 2;
  std::string workflows;
  std::string workflow_state_dir;
  // Autoscaled pools (router/autoscaler.h), and how long a request without
  // a tenant waits for one of them that has no ready replica.
  std::vector<std::string> autoscale;
  double cold_start_timeout = 300;
};

// --tokenizer [NAME=]DIR: the tokenizer of the model NAME (default: the
// directory's name, as `basalt serve` names its model).
std::map<std::string, std::shared_ptr<const TokenizerBundle>> read_tokenizers(const std::vector<std::string>& flags) {
  std::map<std::string, std::shared_ptr<const TokenizerBundle>> out;
  for (const std::string& flag : flags) {
    const size_t eq = flag.find('=');
    std::string dir = eq == std::string::npos ? flag : flag.substr(eq + 1);
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    const std::string name = eq == std::string::npos ? std::filesystem::path(dir).filename().string() : flag.substr(0, eq);
    BASALT_CHECK(!name.empty() && !dir.empty(), "--tokenizer {}: expected [MODEL=]DIR", flag);
    BASALT_CHECK(!out.count(name), "--tokenizer {}: model '{}' has a tokenizer already", flag, name);
    try {
      out[name] = std::make_shared<const TokenizerBundle>(load_tokenizer_dir(dir));
    } catch (const Error& e) {
      fail("--tokenizer {}: {}", flag, e.what());
    }
  }
  return out;
}

// The replicas given by --replica and --replica-file; with no
// --replica-dns there must be one.
std::vector<router::ReplicaSpec> read_replicas(const RouteFlags& f) {
  std::vector<router::ReplicaSpec> specs;
  for (const std::string& text : f.replicas) specs.push_back(router::parse_replica(text, "--replica"));
  if (!f.replica_file.empty())
    for (router::ReplicaSpec& spec :
         router::parse_replica_file(read_text_file(f.replica_file, "--replica-file"), f.replica_file))
      specs.push_back(std::move(spec));
  BASALT_CHECK(!specs.empty() || !f.replica_dns.empty(),
               "no replicas: give --replica URL, --replica-file FILE or --replica-dns HOST:PORT");
  return specs;
}

// Resolves the --replica-dns names every --dns-interval until destroyed,
// logging the list when it changes and a failure when it starts or changes.
class DnsRefresher {
 public:
  DnsRefresher(router::DnsDiscovery& discovery, const router::ReplicaRegistry& registry,
               double interval_s)
      : discovery_(discovery),
        registry_(registry),
        interval_(static_cast<int64_t>(interval_s * 1000)) {
    thread_ = std::thread([this] { run(); });
  }
  ~DnsRefresher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  // One round now (also how the first list is found, before the port opens).
  void refresh_and_log();

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!wake_.wait_for(lock, interval_, [this] { return stop_; })) {
      lock.unlock();
      refresh_and_log();
      lock.lock();
    }
  }

  router::DnsDiscovery& discovery_;
  const router::ReplicaRegistry& registry_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::string last_failures_;  // only touched by one refresh at a time
  std::mutex refresh_mu_;
  std::thread thread_;
};

std::vector<router::Tenant> read_tenants(const std::string& path) {
  return router::parse_tenants(read_text_file(path, "--tenants-file"), path);
}

void log_replicas(const router::ReplicaRegistry& registry) {
  const auto snapshot = registry.snapshot();
  std::string ids;
  for (const router::Replica& r : snapshot->replicas) ids += (ids.empty() ? "" : ",") + r.spec.id;
  LogLine("replicas")
      .add("generation", static_cast<int64_t>(snapshot->generation))
      .add("count", static_cast<int64_t>(snapshot->replicas.size()))
      .add("replicas", ids)
      .emit();
}

void DnsRefresher::refresh_and_log() {
  std::lock_guard<std::mutex> lock(refresh_mu_);
  const router::RefreshResult result = discovery_.refresh();
  if (result.changed) log_replicas(registry_);
  std::string failures;
  for (const std::string& failure : result.failures)
    failures += (failures.empty() ? "" : "; ") + failure;
  if (failures != last_failures_) {
    if (failures.empty())
      LogLine("replica_dns").add("resolved", "again").emit();
    else
      LogLine("replica_dns", LogLevel::kWarning)
          .add("error", failures)
          .add("kept", "the last addresses")
          .emit();
    last_failures_ = failures;
  }
}

void run_route(const RouteFlags& f) {
  HttpServerOptions http = http_server_options(f.http);
  BASALT_CHECK(f.max_attempts >= 1 && f.max_attempts <= 16, "--max-attempts must be in [1, 16]");
  BASALT_CHECK(f.max_failovers >= 0 && f.max_failovers <= 16, "--max-failovers must be in [0, 16]");
  BASALT_CHECK(f.stall_timeout >= 0.1 && f.stall_timeout <= 3600, "--stall-timeout must be in [0.1, 3600] seconds");
  BASALT_CHECK(f.health_interval >= 0.05 && f.health_interval <= 3600,
               "--health-interval must be in [0.05, 3600] seconds");
  BASALT_CHECK(f.health_timeout >= 0.05 && f.health_timeout <= 3600, "--health-timeout must be in [0.05, 3600] seconds");
  BASALT_CHECK(f.metrics_interval >= 0.05 && f.metrics_interval <= 3600,
               "--metrics-interval must be in [0.05, 3600] seconds");
  BASALT_CHECK(f.client_threads >= 1 && f.client_threads <= 64, "--client-threads must be in [1, 64]");
  BASALT_CHECK(f.upstream_timeout > 0 && f.upstream_timeout < 1e7, "--upstream-timeout must be positive seconds");
  BASALT_CHECK(f.drain_timeout > 0 && f.drain_timeout < 1e7, "--drain-timeout must be positive seconds");
  BASALT_CHECK(f.home_pool.empty() || router::valid_placement_name(f.home_pool),
               "--home-pool must be a pool name (1-64 letters, digits, '-', '_' or '.')");
  BASALT_CHECK(f.assumed_prefill_rate >= 1 && f.assumed_prefill_rate <= 1e9,
               "--assumed-prefill-rate must be in [1, 1e9] tokens per second");
  BASALT_CHECK(f.tokenizer_threads >= 1 && f.tokenizer_threads <= 64, "--tokenizer-threads must be in [1, 64]");
  BASALT_CHECK(f.breaker_failures >= 1 && f.breaker_failures <= 1000, "--breaker-failures must be in [1, 1000]");
  BASALT_CHECK(f.breaker_open_seconds >= 0.01 && f.breaker_open_seconds <= 3600,
               "--breaker-open-seconds must be in [0.01, 3600] seconds");
  BASALT_CHECK(f.breaker_half_open_successes >= 1 && f.breaker_half_open_successes <= 1000,
               "--breaker-half-open-successes must be in [1, 1000]");
  BASALT_CHECK(f.dns_interval >= 0.1 && f.dns_interval <= 3600,
               "--dns-interval must be in [0.1, 3600] seconds");
  std::vector<router::DnsTarget> dns_targets;
  for (const std::string& text : f.replica_dns)
    dns_targets.push_back(router::parse_dns_target(text, "--replica-dns"));
  BASALT_CHECK(f.cold_start_timeout >= 0.1 && f.cold_start_timeout <= 86400,
               "--cold-start-timeout must be in [0.1, 86400] seconds");
  std::vector<router::AutoscaleConfig> autoscale;
  for (const std::string& text : f.autoscale) {
    router::AutoscaleConfig c = router::parse_autoscale(text, "--autoscale");
    for (const router::AutoscaleConfig& other : autoscale)
      BASALT_CHECK(other.pool != c.pool, "--autoscale: {} is autoscaled twice",
                   c.pool.empty() ? std::string("the pool of every replica") : "pool " + c.pool);
    autoscale.push_back(std::move(c));
  }
  router::BreakerOptions breaker;
  breaker.failures_to_open = f.breaker_failures;
  breaker.open_for = std::chrono::milliseconds(static_cast<int64_t>(f.breaker_open_seconds * 1000));
  breaker.successes_to_close = f.breaker_half_open_successes;
  router::ReplicaRegistry registry(breaker);
  router::AsioAddressResolver resolver;
  router::DnsDiscovery discovery(registry, resolver, dns_targets);
  discovery.set_fixed(read_replicas(f));
  if (!f.home_pool.empty()) {
    const auto snapshot = registry.snapshot();
    BASALT_CHECK(
        std::any_of(snapshot->replicas.begin(), snapshot->replicas.end(),
                    [&](const router::Replica& r) { return r.spec.pool == f.home_pool; }) ||
            std::any_of(dns_targets.begin(), dns_targets.end(),
                        [&](const router::DnsTarget& t) { return t.labels.pool == f.home_pool; }),
        "--home-pool {}: no replica is labelled pool={}", f.home_pool, f.home_pool);
  }
  for (const router::AutoscaleConfig& c : autoscale) {
    if (c.pool.empty()) continue;
    const auto snapshot = registry.snapshot();
    BASALT_CHECK(
        std::any_of(snapshot->replicas.begin(), snapshot->replicas.end(),
                    [&](const router::Replica& r) { return r.spec.pool == c.pool; }) ||
            std::any_of(dns_targets.begin(), dns_targets.end(),
                        [&](const router::DnsTarget& t) { return t.labels.pool == c.pool; }),
        "--autoscale pool={}: no replica (--replica, --replica-file or --replica-dns) is labelled pool={}", c.pool,
        c.pool);
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // Each stream holds two descriptors: its client's connection and its replica's.
  const uint64_t open_files = raise_file_limit_for_connections(f.http, 2);

  router::TenantBook tenants;
  if (!f.tenants_file.empty()) tenants.set(read_tenants(f.tenants_file));
  router::RouteServerOptions options;
  options.tenants = &tenants;
  options.policy = router::parse_policy(f.policy);
  options.session_header = f.session_header;
  for (char& c : options.session_header) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  options.api_keys = api_keys(f.http);
  options.upstream_api_key = f.upstream_api_key;
  options.max_attempts = f.max_attempts;
  options.max_failovers = f.max_failovers;
  options.stall_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.stall_timeout * 1000));
  options.health.interval = std::chrono::milliseconds(static_cast<int64_t>(f.health_interval * 1000));
  options.health.timeout = std::chrono::milliseconds(static_cast<int64_t>(f.health_timeout * 1000));
  // A scrape may take as long as a probe; its numbers count for three
  // intervals (at least 2 s, GIE's staleness bound).
  options.scrape.interval = std::chrono::milliseconds(static_cast<int64_t>(f.metrics_interval * 1000));
  options.scrape.timeout = options.health.timeout;
  options.scrape.stale_after = std::max(3 * options.scrape.interval, std::chrono::milliseconds(2000));
  options.log_requests = !f.http.no_request_log;
  options.home_pool = f.home_pool;
  options.assumed_prefill_rate = f.assumed_prefill_rate;
  options.tokenizers = read_tokenizers(f.tokenizers);
  options.tokenizer_threads = f.tokenizer_threads;
  options.autoscale = autoscale;
  options.cold_start_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.cold_start_timeout * 1000));
  BASALT_CHECK(options.tokenizers.empty() || options.policy == router::Policy::kCacheAware,
               "--tokenizer is for --policy cache-aware (it reads the replicas' KV events to route by cached prefix)");
  // Workflows are read before any thread starts: a bad definition stops
  // the command with every problem named.
  std::map<std::string, std::shared_ptr<const workflow::Workflow>> workflow_defs;
  if (!f.workflows.empty()) workflow_defs = workflow::load_workflows(f.workflows);
  BASALT_CHECK(f.workflow_state_dir.empty() || !f.workflows.empty(),
               "--workflow-state-dir keeps the record of workflow runs: it needs --workflows");
  std::unique_ptr<workflow::WorkflowService> workflows;
  if (!workflow_defs.empty()) {
    options.workflows = [&workflows](HttpRequest& request) { return workflows->handle(request); };
    options.extra_metrics = [&workflows] { return workflows->metrics_text(); };
  }
  HttpClientOptions client_options;
  client_options.timeout_s = f.upstream_timeout;
  client_options.max_body_bytes = f.http.max_body_bytes > (size_t{64} << 20) ? f.http.max_body_bytes : size_t{64} << 20;

  // The replicas' connections run on threads of their own, started once
  // every flag and file above has been read (a bad one is an error, not a
  // terminate() with threads running); stopped and joined however this
  // function is left, the port already taken included.
  boost::asio::io_context client_io;
  auto work = boost::asio::make_work_guard(client_io);
  std::vector<std::thread> client_threads;
  struct JoinOnExit {
    boost::asio::executor_work_guard<boost::asio::io_context::executor_type>& work;
    boost::asio::io_context& io;
    std::vector<std::thread>& threads;
    ~JoinOnExit() {
      work.reset();
      io.stop();
      for (std::thread& t : threads)
        if (t.joinable()) t.join();
    }
  } join_on_exit{work, client_io, client_threads};
  for (int i = 0; i < f.client_threads; ++i) client_threads.emplace_back([&client_io] { client_io.run(); });
  router::RouteServer route(registry, client_io, options, client_options);
  if (!workflow_defs.empty()) {
    workflow::ServiceOptions workflow_options;
    workflow_options.state_dir = f.workflow_state_dir;
    workflow_options.session_header = options.session_header;
    workflow_options.log_steps = options.log_requests;
    // A step is a request to this gateway's own handler: routed, retried
    // and failed over as a client's would be.
    workflows = std::make_unique<workflow::WorkflowService>(
        std::move(workflow_defs), [&route](HttpRequest& request) { return route.handle(request); }, client_io,
        workflow_options);
    LogLine("workflows").add("loaded", f.workflows).add("replayed_runs", static_cast<uint64_t>(workflows->replayed_runs())).emit();
  }
  http.on_rejection = [&route](const TransportRejection& r) { route.note_rejection(r); };
  HttpServer server(http, [&route](HttpRequest& request) { return route.handle(request); });
  // The names are resolved once before the port opens, then on a thread
  // (signals are blocked in it, as in every thread started here).
  std::unique_ptr<DnsRefresher> dns_refresher;
  if (!dns_targets.empty()) {
    dns_refresher = std::make_unique<DnsRefresher>(discovery, registry, f.dns_interval);
    dns_refresher->refresh_and_log();
  }
  server.start();
  LogLine("listening").add("url", fmt::format("{}://{}:{}", http_scheme(f.http), f.http.host, server.port())).emit();
  log_replicas(registry);
  LogLine("ready").add("policy", router::policy_name(options.policy)).add("max_attempts", f.max_attempts).add("max_failovers", f.max_failovers).add("api_keys", !options.api_keys.empty()).add("exact_cache", !options.tokenizers.empty()).add("open_files", open_files).emit();

  while (true) {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    if (signal_number != SIGHUP) {
      LogLine("draining").add("signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT").emit();
      break;
    }
    try {
      discovery.set_fixed(read_replicas(f));
      log_replicas(registry);
    } catch (const Error& e) {
      LogLine("replicas", LogLevel::kWarning).add("reload", "refused").add("error", e.what()).emit();
    }
    if (workflows) {
      try {
        auto defs = workflow::load_workflows(f.workflows);
        const auto count = static_cast<uint64_t>(defs.size());
        workflows->set_workflows(std::move(defs));
        LogLine("workflows").add("reload", "ok").add("count", count).emit();
      } catch (const Error& e) {
        LogLine("workflows", LogLevel::kWarning).add("reload", "refused").add("error", e.what()).emit();
      }
    }
    if (!f.tenants_file.empty()) {
      try {
        tenants.set(read_tenants(f.tenants_file));
        LogLine("tenants").add("count", static_cast<int64_t>(tenants.running().size())).emit();
      } catch (const Error& e) {
        LogLine("tenants", LogLevel::kWarning).add("reload", "refused").add("error", e.what()).emit();
      }
    }
  }
  server.stop_accepting();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(f.drain_timeout * 1000));
  const timespec tick{0, 20 * 1000 * 1000};
  while (server.responses_in_progress() > 0 && std::chrono::steady_clock::now() < deadline) {
    if (sigtimedwait(&signals, nullptr, &tick) > 0) break;  // a second signal: stop now
  }
  server.stop();
  work.reset();
  client_io.stop();
  for (std::thread& t : client_threads) t.join();
  LogLine("stopped").emit();
}

}  // namespace

void add_route_command(CLI::App& app) {
  auto flags = std::make_shared<RouteFlags>();
  CLI::App* cmd = app.add_subcommand(
      "route", "Serve the OpenAI-compatible API over several `basalt serve` replicas (a gateway)");
  RouteFlags& f = *flags;
  // A gateway holds every stream open at once (2,000 req/s of 5 s streams
  // is 10,000), and a connection costs it little: a socket and a strand.
  f.http.max_connections = 65536;
  add_http_flags(*cmd, f.http);
  cmd->add_option("--replica", f.replicas,
                  "A replica: its root URL, then labels, e.g. 'http://10.0.0.5:8000 region=eu pool=a model=llama' "
                  "(repeatable). A replica with a model label gets that model's requests only");
  cmd->add_option("--replica-file", f.replica_file,
                  "Read replicas from this file, one per line as for --replica ('#' comments); re-read on SIGHUP");
  cmd->add_option(
      "--replica-dns", f.replica_dns,
      "HOST:PORT, then labels as for --replica: every A and AAAA address of HOST is the replica "
      "http://ADDRESS:PORT, resolved again every --dns-interval (a Kubernetes headless Service's "
      "name lists its ready pods); addresses that vanish drain, new ones join (repeatable)");
  cmd->add_option("--dns-interval", f.dns_interval,
                  "Seconds between resolutions of --replica-dns (default 5)");
  cmd->add_option("--policy", f.policy,
                  "How a request's replica is chosen: cache-aware (the one holding the longest part of the prompt "
                  "in its cache, exactly with --tokenizer, else where this gateway sent it, unless it is much "
                  "busier), round-robin, least-load (the fewest requests queued and "
                  "running by the replica's scraped /metrics plus those sent since, else in flight from the "
                  "gateway), power-of-two (the less loaded of two drawn at random) or session (a session stays on "
                  "its replica: --session-header, else the body's user) (default cache-aware)");
  cmd->add_option("--session-header", f.session_header,
                  "The header that names a request's session for --policy session (default X-Session-Id)");
  cmd->add_option("--tenants-file", f.tenants_file,
                  "Tenants (JSON: classes, keys, weights, limits, share_cache; docs/ROUTER.md): their keys are "
                  "accepted, their requests rate-, token- and concurrency-limited (429 with Retry-After), queued by "
                  "class and weight while the replicas are saturated, and kept in their own cache namespace; "
                  "re-read on SIGHUP");
  cmd->add_option("--upstream-api-key", f.upstream_api_key,
                  "Send this API key to the replicas (the clients' keys are never forwarded)");
  cmd->add_option("--max-attempts", f.max_attempts,
                  "Replicas one request may be tried on before anything reached its client (default 3)");
  cmd->add_option("--max-failovers", f.max_failovers,
                  "Times one stream may be resumed on another replica after its replica failed it mid-stream "
                  "(default 2; 0: end it with an error event)");
  cmd->add_option("--stall-timeout", f.stall_timeout,
                  "Seconds without a byte after which a streaming replica counts as stalled and the stream is "
                  "resumed elsewhere (default 10; replicas are asked for a heartbeat every quarter of it)");
  cmd->add_option("--health-interval", f.health_interval,
                  "Seconds between /ready probes of each replica; 2 failed in a row take it out, 2 passed bring it "
                  "back (default 2)");
  cmd->add_option("--health-timeout", f.health_timeout, "Seconds a /ready probe (or a /metrics scrape) may take (default 1)");
  cmd->add_option("--metrics-interval", f.metrics_interval,
                  "Seconds between scrapes of each replica's /metrics (its queue, batch and KV usage: the load "
                  "policies compare and the saturation the tenants' queue waits on) (default 1)");
  cmd->add_option("--upstream-timeout", f.upstream_timeout,
                  "Seconds one attempt on a replica may take in all (default 600)");
  cmd->add_option("--client-threads", f.client_threads, "Threads running the connections to replicas (default 2)");
  cmd->add_option("--drain-timeout", f.drain_timeout,
                  "Seconds forwarded requests may take to finish after SIGTERM (default 30)");
  cmd->add_option("--home-pool", f.home_pool,
                  "The pool (replica label pool=) of requests whose tenant names none (default: every replica)");
  cmd->add_option("--assumed-prefill-rate", f.assumed_prefill_rate,
                  "A replica's prefill tokens per second for the pools' estimated queue time, until its "
                  "/metrics show one (default 2000)");
  cmd->add_option("--tokenizer", f.tokenizers,
                  "[MODEL=]DIR: the tokenizer of a model's replicas (a model directory; MODEL defaults to the "
                  "directory's name, as serve names it). With it, --policy cache-aware is exact for that model: the "
                  "gateway tokenizes its prompts as the replicas do and reads their KV events (GET /v1/kv_events) "
                  "to know what each one holds (repeatable)");
  cmd->add_option("--tokenizer-threads", f.tokenizer_threads,
                  "Threads tokenizing prompts for --tokenizer, off the I/O threads (default 2)");
  cmd->add_option("--breaker-failures", f.breaker_failures,
                  "Failed attempts in a row (broken, timed out, 5xx, stalled, cut) that open a replica's circuit "
                  "breaker: it gets no requests for --breaker-open-seconds (default 5)");
  cmd->add_option("--breaker-open-seconds", f.breaker_open_seconds,
                  "Seconds an open breaker keeps its replica out before letting one trial request at a time "
                  "through (half-open) (default 10; a passing /ready probe ends the wait early)");
  cmd->add_option("--breaker-half-open-successes", f.breaker_half_open_successes,
                  "Trial requests that must succeed in a row to close a half-open breaker; one failure opens it "
                  "again (default 2)");
  cmd->add_option("--autoscale", f.autoscale,
                  "An autoscaled pool: 'pool=NAME metric=concurrency|queue_time|ttft_p95 target=X min=N max=N "
                  "up_after=30s down_after=5m' (every key optional; no pool: every replica; defaults concurrency, "
                  "target 8 requests per replica, min 1, max 8, 30s, 5m; a metric in seconds needs its target). Its "
                  "desired replica count (raised after up_after above 1.1 x target, lowered one step per down_after "
                  "below 0.7 x target, at least 1 while requests wait at zero) is on /metrics "
                  "(basalt_route_desired_replicas) and GET /v1/autoscale, evaluated every --metrics-interval; a "
                  "request for it with no ready replica waits here until one is (repeatable, one per pool)");
  cmd->add_option("--cold-start-timeout", f.cold_start_timeout,
                  "Seconds a request without a tenant waits for an autoscaled pool with no ready replica before "
                  "its 503 (a tenant's waits its class's queue_deadline_ms) (default 300)");
  cmd->add_option("--workflows", f.workflows,
                  "A workflow definition (JSON, docs/WORKFLOWS.md) or a directory of them (*.json): run by "
                  "POST /v1/workflows/NAME/runs, their steps routed over the replicas; re-read on SIGHUP");
  cmd->add_option("--workflow-state-dir", f.workflow_state_dir,
                  "Keep each workflow run's record here (one append-only file per run), replayed at start: a run "
                  "posted again with its run_id resumes without re-running finished steps");
  cmd->callback([flags] { run_route(*flags); });
}

}  // namespace basalt
