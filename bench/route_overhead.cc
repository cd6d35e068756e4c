// What `basalt route` adds to a stream's latency (docs/ROUTER.md §7, the
// overhead benchmark of step 18).
//
//   basalt_bench_route_overhead [--basalt build/bin/basalt] [--rate 2000] [--duration 10]
//       [--events 10] [--interval-ms 500] [--gateway-cpus 0-3] [--replica-cpus 4-7]
//       [--client-cpus 8-15] [--io-threads N] [--client-threads N] [--json]
//   basalt_bench_route_overhead --help     # every flag
//
// Three parties on one host, each on its own CPUs when asked:
//  * Fake replicas (--replicas, default 1), in this process, on the
//    transport `basalt serve` uses (server/http_server.h, --replica-threads
//    I/O threads): POST /v1/completions with "stream": true is answered by
//    an SSE stream of --events completion chunks, the first at once, then
//    one every --interval-ms, then `data: [DONE]` one interval after the
//    last (so a stream lasts events × interval); each chunk carries
//    "sent_ns", the steady clock (CLOCK_MONOTONIC) read on the connection's
//    strand just before the chunk is written. Asked for resume comments
//    (X-Basalt-Resume-Info, as the gateway asks), each chunk is preceded by
//    its `: basalt` comment, as `basalt serve` writes it, so the gateway does
//    its full work per event. GET /ready, /health, /v1/models and /metrics
//    (the gauges router/replica_metrics.cc reads: basalt_requests_waiting,
//    basalt_requests_running, basalt_kv_cache_usage_ratio and the counter
//    basalt_prefill_tokens_total) keep the gateway's health checker and
//    scraper content.
//  * The gateway: the real binary, `basalt route --replica URL... --port 0`,
//    started as a child process (under `taskset -c LIST` with
//    --gateway-cpus; --io-threads, --client-threads and any --gateway-arg
//    passed on), its log in --gateway-log (default: a temporary file, removed
//    after a run without errors). It ends with SIGTERM, or with this
//    process (PR_SET_PDEATHSIG).
//  * The load, in this process: --load-threads threads, each with its own
//    io_context and HttpClient (server/http_client.h, keep-alive pools),
//    sending requests at a fixed rate (one every 1/--rate s, dealt round
//    the threads) for --duration seconds, once straight to the replicas
//    (round-robin) and once through the gateway (--mode picks one or both).
//
// Measured per run: per event, receive time − sent_ns (the receive time read
// once per socket read); per request, TTFT = first event − the moment the
// request was handed to the client; the peak of streams open at once; how
// late requests went out against their schedule (the client's own lag),
// the replicas' lag (sent_ns − the event's due time), and the CPU seconds of
// the load threads and of the gateway (/proc), and the gateway's own
// histogram of an event's time inside it (basalt_route_added_latency_seconds
// from its /metrics, as bucket bounds). The report gives P50, P90,
// P99, P99.9 and max of both latencies for each run and the difference of
// the gateway's percentiles and the direct ones (what the gateway adds), as
// a table, or with --json as one JSON object on stdout (the table then goes
// to stderr).
//
// A request is an error when its connection fails or times out, its status
// is not 200, its stream breaks, or it ends without `data: [DONE]` or with
// another number of events than sent. Exit status: 0, 1 when a run had
// errors, 2 for bad flags or a gateway that did not start.
//
// RLIMIT_NOFILE is raised to the hard limit at start: at 2,000 req/s of 5 s
// streams this process holds 20,000 sockets through the gateway (the
// clients' and the replicas' ends), and so does the gateway.
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/file_limit.h"
#include "loadgen/stats.h"
#include "router/prometheus_reader.h"
#include "server/http_client.h"
#include "server/http_server.h"
#include "server/sse.h"

namespace basalt {
namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// ---------------------------------------------------------------- flags

struct Flags {
  std::string basalt;  // empty: bin/basalt beside this program's build directory
  double rate = 2000;
  double duration = 10;
  int events = 10;
  int interval_ms = 500;
  int prompt_bytes = 512;
  int replicas = 1;
  int replica_threads = 0;  // 0: one per --replica-cpus CPU, else 2
  int load_threads = 0;     // 0: one per --client-cpus CPU, else 2
  std::string gateway_cpus, replica_cpus, client_cpus;
  int io_threads = 0;       // 0: the gateway's default
  int client_threads = 0;   // 0: the gateway's default
  std::vector<std::string> gateway_args;
  std::string gateway_log;  // empty: a file in a fresh temporary directory
  std::string mode = "both";
  bool json = false;
};

const char kUsage[] =
    "basalt_bench_route_overhead: the latency `basalt route` adds to streamed completions\n"
    "\n"
    "  --basalt PATH         the basalt binary (default: bin/basalt of this build)\n"
    "  --rate R              requests per second, evenly spaced (default 2000)\n"
    "  --duration S          seconds of arrivals per run (default 10)\n"
    "  --events N            chunks per stream (default 10)\n"
    "  --interval-ms MS      between chunks, and from the last to [DONE], at most 5000 (the gateway\n"
    "                        takes a replica silent for its --stall-timeout, 10 s, for stalled) (default 500)\n"
    "  --prompt-bytes N      the prompt's length (default 512)\n"
    "  --replicas N          fake replicas behind the gateway (default 1)\n"
    "  --replica-threads N   I/O threads of each fake replica (default: one per --replica-cpus CPU, else 2)\n"
    "  --load-threads N      load generator threads (default: one per --client-cpus CPU, else 2)\n"
    "  --gateway-cpus LIST   run the gateway under taskset -c LIST (e.g. 0-3)\n"
    "  --replica-cpus LIST   pin the fake replicas' threads (e.g. 4-7)\n"
    "  --client-cpus LIST    pin the load generator's threads (e.g. 8-15)\n"
    "  --io-threads N        the gateway's --io-threads (default: its own default)\n"
    "  --client-threads N    the gateway's --client-threads (default: its own default)\n"
    "  --gateway-arg ARG     one more argument for `basalt route` (repeatable), e.g. --gateway-arg=--no-request-log\n"
    "  --gateway-log FILE    where the gateway's log goes (default: a temporary file, named in the report)\n"
    "  --mode M              both (direct, then through the gateway), direct or gateway (default both)\n"
    "  --json                the report as one JSON object on stdout (the table goes to stderr)\n";

// "0-3,8,10-11" → {0, 1, 2, 3, 8, 10, 11}; throws on anything else.
std::vector<int> parse_cpu_list(const std::string& text, const char* flag) {
  std::vector<int> cpus;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    const size_t dash = part.find('-');
    const std::string a = part.substr(0, dash);
    const std::string b = dash == std::string::npos ? a : part.substr(dash + 1);
    auto number = [&](const std::string& s) {
      BASALT_CHECK(!s.empty() && s.size() <= 4 && s.find_first_not_of("0123456789") == std::string::npos,
                   "{} '{}': expected CPU numbers and ranges, e.g. 0-3,8", flag, text);
      return std::stoi(s);
    };
    const int lo = number(a), hi = number(b);
    BASALT_CHECK(lo <= hi && hi < CPU_SETSIZE, "{} '{}': bad range {}", flag, text, part);
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  BASALT_CHECK(!cpus.empty(), "{} needs at least one CPU", flag);
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos && name.rfind("--", 0) == 0) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "--help" || name == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (name == "--json") {
      BASALT_CHECK(!value, "--json takes no value");
      f.json = true;
      continue;
    }
    static const char* kValued[] = {"--basalt",         "--rate",          "--duration",     "--events",
                                    "--interval-ms",    "--prompt-bytes",  "--replicas",     "--replica-threads",
                                    "--load-threads",   "--gateway-cpus",  "--replica-cpus", "--client-cpus",
                                    "--io-threads",     "--client-threads", "--gateway-arg", "--gateway-log",
                                    "--mode"};
    BASALT_CHECK(std::find(std::begin(kValued), std::end(kValued), name) != std::end(kValued),
                 "unknown flag {} (see --help)", name);
    if (!value) {
      BASALT_CHECK(i + 1 < argc, "{} needs a value (see --help)", name);
      value = argv[++i];
    }
    const std::string& v = *value;
    auto number = [&](double lo, double hi) {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      BASALT_CHECK(!v.empty() && *end == '\0' && std::isfinite(x) && x >= lo && x <= hi,
                   "{} {}: expected a number in [{}, {}]", name, v, lo, hi);
      return x;
    };
    auto integer = [&](int lo, int hi) {
      const double x = number(lo, hi);
      BASALT_CHECK(x == std::floor(x), "{} {}: expected a whole number", name, v);
      return static_cast<int>(x);
    };
    if (name == "--basalt") f.basalt = v;
    else if (name == "--rate") f.rate = number(0.1, 1e6);
    else if (name == "--duration") f.duration = number(0.1, 86400);
    else if (name == "--events") f.events = integer(1, 100000);
    else if (name == "--interval-ms") f.interval_ms = integer(1, 5000);
    else if (name == "--prompt-bytes") f.prompt_bytes = integer(1, 1 << 20);
    else if (name == "--replicas") f.replicas = integer(1, 64);
    else if (name == "--replica-threads") f.replica_threads = integer(1, 256);
    else if (name == "--load-threads") f.load_threads = integer(1, 256);
    else if (name == "--gateway-cpus") f.gateway_cpus = v;
    else if (name == "--replica-cpus") f.replica_cpus = v;
    else if (name == "--client-cpus") f.client_cpus = v;
    else if (name == "--io-threads") f.io_threads = integer(1, 64);
    else if (name == "--client-threads") f.client_threads = integer(1, 64);
    else if (name == "--gateway-arg") f.gateway_args.push_back(v);
    else if (name == "--gateway-log") f.gateway_log = v;
    else f.mode = v;  // --mode
  }
  BASALT_CHECK(f.mode == "both" || f.mode == "direct" || f.mode == "gateway",
               "--mode must be both, direct or gateway, got {}", f.mode);
  return f;
}

// ---------------------------------------------------------------- CPUs

cpu_set_t cpu_set_of(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return set;
}

// The CPUs of a flag, each one this process may run on.
std::vector<int> cpus_of(const std::string& list, const char* flag, const cpu_set_t& allowed) {
  if (list.empty()) return {};
  std::vector<int> cpus = parse_cpu_list(list, flag);
  for (int c : cpus)
    BASALT_CHECK(CPU_ISSET(c, &allowed), "{} {}: CPU {} is not one this process may run on (nproc: {})", flag, list, c,
                 CPU_COUNT(&allowed));
  return cpus;
}

// Pins the calling thread (threads it starts afterwards inherit the set);
// the CPUs were checked by cpus_of.
void pin_this_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  const cpu_set_t set = cpu_set_of(cpus);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

double thread_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_THREAD, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// ---------------------------------------------------------------- the fake replica

// Shared by the fake replicas: the clock the streams' timers run on, and
// what the replicas count.
struct ReplicaSide {
  asio::io_context timers;
  int events = 10;
  std::chrono::milliseconds interval{500};
  std::mutex mu;                  // guards lag_ns
  std::vector<int64_t> lag_ns;    // per event: sent_ns − its due time
  std::atomic<int64_t> streams{0};         // streams begun
  std::atomic<int64_t> running{0};         // streams open now
  std::atomic<int64_t> resumable{0};       // streams that asked for resume comments (the gateway's)
  std::atomic<int64_t> prefill_tokens{0};  // a counter for /metrics to report

  void take_lags(std::vector<int64_t>& out) {
    std::lock_guard<std::mutex> lock(mu);
    out.swap(lag_ns);
    lag_ns.clear();
  }
};

// One completion stream: chunk k is due k intervals after start(), [DONE]
// `events` intervals after it. A timer wakes the connection at each due
// time; pull() writes whatever is due, stamped as it goes out.
class StreamProducer : public ResponseProducer {
 public:
  StreamProducer(ReplicaSide& side, std::string id, std::string model, bool resume_info)
      : side_(side), id_(std::move(id)), model_(std::move(model)), resume_info_(resume_info),
        timer_(std::make_shared<Timer>(side.timers)) {}
  ~StreamProducer() override {
    stop_timer();
    finish();
  }

  void start(std::function<void()> wake) override {
    start_ = Clock::now();
    created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count();
    side_.streams.fetch_add(1);
    side_.running.fetch_add(1);
    counted_ = true;
    if (resume_info_) side_.resumable.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(timer_->mu);
      timer_->wake = std::move(wake);
    }
    arm(1);  // chunk 0 is due now: the transport pulls right after start()
  }

  void pull(Output& out) override {
    if (!head_sent_) {
      HttpResponse head;
      head.content_type = "text/event-stream";
      head.headers.emplace_back("X-Request-Id", id_);
      head.headers.emplace_back("Cache-Control", "no-cache");
      out.head = std::move(head);
      head_sent_ = true;
    }
    const Clock::time_point now = Clock::now();
    const int64_t sent = ns_of(now);
    std::vector<int64_t> lags;
    while (next_ <= side_.events && due(next_) <= now) {
      if (next_ == side_.events) {
        out.data += "data: [DONE]\n\n";
        out.done = true;
        ++next_;
        finish();
        break;
      }
      append_chunk(out.data, next_, sent);
      lags.push_back(sent - ns_of(due(next_)));
      ++next_;
    }
    if (!lags.empty()) {
      std::lock_guard<std::mutex> lock(side_.mu);
      side_.lag_ns.insert(side_.lag_ns.end(), lags.begin(), lags.end());
    }
    if (!out.done && next_ <= side_.events) arm(next_);
  }

  void abort() override {
    stop_timer();
    finish();
  }

 private:
  // The timer and the wake-up it calls, shared with the timer's handler
  // (which may outlive the producer); `mu` orders arming against stopping.
  struct Timer {
    explicit Timer(asio::io_context& io) : timer(io) {}
    std::mutex mu;
    asio::steady_timer timer;
    std::function<void()> wake;
    int armed_for = -1;  // the message the timer waits for
    bool stopped = false;
  };

  Clock::time_point due(int k) const { return start_ + k * side_.interval; }

  // Wakes the connection when message k is due (at once when it is).
  void arm(int k) {
    std::shared_ptr<Timer> t = timer_;
    std::lock_guard<std::mutex> lock(t->mu);
    if (t->stopped || t->armed_for == k) return;
    t->armed_for = k;
    t->timer.expires_at(due(k));
    t->timer.async_wait([t](const boost::system::error_code& ec) {
      if (ec) return;
      std::function<void()> wake;
      {
        std::lock_guard<std::mutex> lock(t->mu);
        if (t->stopped) return;
        wake = t->wake;
      }
      if (wake) wake();
    });
  }

  void stop_timer() {
    std::lock_guard<std::mutex> lock(timer_->mu);
    if (timer_->stopped) return;
    timer_->stopped = true;
    timer_->wake = nullptr;
    timer_->timer.cancel();
  }

  void finish() {
    if (!counted_) return;
    counted_ = false;
    side_.running.fetch_sub(1);
  }

  // Chunk k as `basalt serve` streams a completion, its resume comment first
  // when asked, sent_ns added.
  void append_chunk(std::string& out, int k, int64_t sent) {
    const std::string text = fmt::format(" tok{}", k);
    const bool last = k + 1 == side_.events;
    text_bytes_ += static_cast<int64_t>(text.size());
    if (resume_info_)
      out += fmt::format(": basalt {{\"i\":0,\"t\":[{}],\"o\":{},\"f\":{}}}\n", 1000 + k, text_bytes_, last ? 1 : 0);
    out += fmt::format(
        "data: {{\"id\":\"{}\",\"object\":\"text_completion\",\"created\":{},\"model\":\"{}\",\"choices\":[{{"
        "\"index\":0,\"text\":\"{}\",\"logprobs\":null,\"finish_reason\":{}}}],\"sent_ns\":{}}}\n\n",
        id_, created_, model_, text, last ? "\"length\"" : "null", sent);
  }

  ReplicaSide& side_;
  std::string id_;
  std::string model_;
  bool resume_info_;
  std::shared_ptr<Timer> timer_;
  Clock::time_point start_;
  int64_t created_ = 0;
  int next_ = 0;  // the next message: chunks 0..events-1, then [DONE] (= events)
  int64_t text_bytes_ = 0;
  bool head_sent_ = false;
  bool counted_ = false;
};

class FakeReplica {
 public:
  FakeReplica(ReplicaSide& side, int io_threads) : side_(side) {
    HttpServerOptions o;
    o.port = 0;
    o.io_threads = io_threads;
    o.max_connections = size_t{1} << 20;
    o.idle_timeout = std::chrono::milliseconds(600000);
    server_ = std::make_unique<HttpServer>(o, [this](HttpRequest& r) { return handle(r); });
    server_->start();
  }
  ~FakeReplica() { server_->stop(); }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", server_->port()); }

 private:
  HandlerResult handle(HttpRequest& request) {
    HttpResponse r;
    if (request.method == "GET" && (request.path == "/ready" || request.path == "/health")) {
      r.body = R"({"status":"ok"})";
    } else if (request.method == "GET" && request.path == "/v1/models") {
      r.body = R"({"object":"list","data":[{"id":"bench","object":"model","created":0,"owned_by":"basalt"}]})";
    } else if (request.method == "GET" && request.path == "/metrics") {
      r.content_type = "text/plain; version=0.0.4";
      r.body = fmt::format(
          "# TYPE basalt_requests_waiting gauge\nbasalt_requests_waiting 0\n"
          "# TYPE basalt_requests_running gauge\nbasalt_requests_running {}\n"
          "# TYPE basalt_kv_cache_usage_ratio gauge\nbasalt_kv_cache_usage_ratio 0\n"
          "# TYPE basalt_prefill_tokens_total counter\nbasalt_prefill_tokens_total {}\n",
          side_.running.load(), side_.prefill_tokens.load());
    } else if (request.method == "POST" && request.path == "/v1/completions") {
      const json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
      if (!body.is_object() || !body.value("stream", false)) {
        r.status = 400;
        r.body = R"({"error":{"message":"this fake replica streams only","type":"invalid_request_error"}})";
      } else {
        const json prompt = body.value("prompt", json());
        side_.prefill_tokens.fetch_add(prompt.is_string() ? static_cast<int64_t>(prompt.get_ref<const std::string&>().size()) / 4 : 1);
        const std::string id = fmt::format("{}-{}", request.header("x-request-id").value_or("bench"), next_id_.fetch_add(1));
        const bool resume_info = request.header("x-basalt-resume-info").value_or("") == "1";
        return {HttpResponse{}, std::make_unique<StreamProducer>(side_, "cmpl-" + id, body.value("model", "bench"),
                                                                 resume_info)};
      }
    } else {
      r.status = 404;
      r.body = R"({"error":{"message":"not found","type":"invalid_request_error"}})";
    }
    return {std::move(r), nullptr};
  }

  ReplicaSide& side_;
  std::atomic<int64_t> next_id_{0};
  std::unique_ptr<HttpServer> server_;
};

// ---------------------------------------------------------------- the gateway

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// An executable's path: as given when it has a '/', else searched in PATH.
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return dir + "/" + name;
  fail("{} was not found in PATH", name);
}

// GET url+path from a thread of its own: the status, 0 when no answer came.
int http_status(const std::string& url, const std::string& path, double timeout_s, std::string* body = nullptr) {
  asio::io_context io(1);
  HttpClientOptions o;
  o.timeout_s = timeout_s;
  HttpClient client(io, parse_base_url(url), o);
  OutgoingRequest req;
  req.path = path;
  int status = 0;
  ExchangeCallbacks c;
  c.on_head = [&](const IncomingHead& h) { status = h.status; };
  c.on_data = [&](std::string_view d) {
    if (body) body->append(d);
  };
  c.on_done = [&](HttpFailure f, const std::string&) {
    if (f != HttpFailure::kNone) status = 0;
  };
  client.send(std::move(req), std::move(c));
  io.run();
  return status;
}

class Gateway {
 public:
  Gateway(const Flags& f, const std::vector<std::string>& replica_urls, const fs::path& log) : log_(log) {
    std::vector<std::string> args;
    if (!f.gateway_cpus.empty()) args = {find_program("taskset"), "-c", f.gateway_cpus};
    args.insert(args.end(), {f.basalt, "route", "--host", "127.0.0.1", "--port", "0"});
    for (const std::string& url : replica_urls) args.insert(args.end(), {"--replica", url});
    if (f.io_threads > 0) args.insert(args.end(), {"--io-threads", std::to_string(f.io_threads)});
    if (f.client_threads > 0) args.insert(args.end(), {"--client-threads", std::to_string(f.client_threads)});
    args.insert(args.end(), f.gateway_args.begin(), f.gateway_args.end());
    for (const std::string& a : args) command_ += (command_.empty() ? "" : " ") + a;

    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int out = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    BASALT_CHECK(out >= 0 && err >= 0, "cannot open the gateway's log {}: {}", log.string(), std::strerror(errno));
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      // The child: only async-signal-safe calls until exec. It dies with
      // this thread, so a killed benchmark leaves no gateway behind.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(out, 1);
      ::dup2(err, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out);
    ::close(err);
    BASALT_CHECK(pid_ > 0, "fork: {}", std::strerror(errno));
  }

  ~Gateway() { stop(); }

  // Waits for the `listening` and `ready` lines (text or JSON logs), then
  // for /ready 200.
  void wait_ready(double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (port_ == 0) {
      const std::string log = read_file(log_);
      for (const std::string mark : {"listening url=http://127.0.0.1:", R"("event":"listening","url":"http://127.0.0.1:)"}) {
        const size_t at = log.find(mark);
        const bool ready = log.find(" info ready ") != std::string::npos ||
                           log.find(R"("event":"ready")") != std::string::npos;
        if (at != std::string::npos && ready) port_ = std::atoi(log.c_str() + at + mark.size());
      }
      if (port_ != 0) break;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        fail("the gateway exited before it was ready; its log ({}):\n{}", log_.string(), tail(log));
      }
      BASALT_CHECK(Clock::now() < deadline, "the gateway was not ready within {} s; its log ({}):\n{}", timeout_s,
                   log_.string(), tail(log));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    while (http_status(url(), "/ready", 1.0) != 200) {
      BASALT_CHECK(Clock::now() < deadline, "the gateway's /ready did not answer 200 within {} s", timeout_s);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  const std::string& command() const { return command_; }
  pid_t pid() const { return pid_; }

  // User + system CPU seconds so far (/proc/PID/stat, fields 14 and 15).
  double cpu_seconds() const {
    const std::string stat = read_file(fmt::format("/proc/{}/stat", pid_));
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) return 0;
    std::stringstream in(stat.substr(paren + 2));
    std::string field;
    double ticks = 0;
    for (int i = 3; i <= 15 && in >> field; ++i)
      if (i == 14 || i == 15) ticks += std::atof(field.c_str());
    return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }

  // The peak resident set (VmHWM), in MiB.
  double peak_rss_mib() const {
    const std::string status = read_file(fmt::format("/proc/{}/status", pid_));
    const size_t at = status.find("VmHWM:");
    return at == std::string::npos ? 0 : std::atof(status.c_str() + at + 6) / 1024.0;
  }

  // SIGTERM, then SIGKILL after 10 s.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 1000; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = 0;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }

 private:
  static std::string tail(const std::string& log) {
    return log.size() <= 4000 ? log : log.substr(log.size() - 4000);
  }

  fs::path log_;
  std::string command_;
  pid_t pid_ = 0;
  int port_ = 0;
};

// ---------------------------------------------------------------- the load

struct LaneStats {
  std::vector<int64_t> event_ns;  // receive − sent, per event
  std::vector<int64_t> event_at_ns;  // sent, per event (for the timeline)
  std::vector<int64_t> ttft_ns;   // first event − send, per answered request
  std::vector<int64_t> lag_ns;    // send − due, per request
  int64_t requests = 0, ok = 0, events = 0;
  std::map<std::string, int64_t> errors;  // by kind
  std::string first_error;
  double cpu_s = 0;
};

// Streams open across every lane, and the most at once.
struct Concurrency {
  std::atomic<int64_t> open{0};
  std::atomic<int64_t> peak{0};
  void up() {
    const int64_t now = open.fetch_add(1) + 1;
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
  void down() { open.fetch_sub(1); }
};

// One load thread: its io_context, its clients (one per target), and the
// arrivals j = index, index + lanes, ... of the schedule.
class Lane {
 public:
  struct Plan {
    std::vector<std::string> targets;  // requests go round them by arrival number
    Clock::time_point start;
    double rate = 0;
    int64_t total = 0;  // arrivals in the run, across lanes
    int lanes = 1;
    int events = 10;
    double timeout_s = 60;
    std::string prompt;
    std::vector<int> cpus;
  };

  Lane(int index, const Plan& plan, Concurrency& concurrency)
      : plan_(plan), concurrency_(concurrency), io_(1), work_(io_.get_executor()), timer_(io_) {
    HttpClientOptions o;
    o.timeout_s = plan.timeout_s;
    o.user_agent = "basalt-bench-route-overhead";
    for (const std::string& t : plan.targets) clients_.push_back(std::make_unique<HttpClient>(io_, parse_base_url(t), o));
    next_ = index;
  }

  ~Lane() {
    work_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  void start() {
    thread_ = std::thread([this] {
      pin_this_thread(plan_.cpus);
      const double cpu0 = thread_cpu_seconds();
      schedule();
      io_.run();
      stats_.cpu_s = thread_cpu_seconds() - cpu0;
    });
  }

  // Every arrival sent and ended.
  bool finished() const { return all_sent_.load() && open_.load() == 0; }

  // Stops the thread (streams still open are counted as unfinished).
  LaneStats stop() {
    asio::post(io_, [this] {
      if (open_.load() == 0) return;
      stats_.errors["unfinished"] += open_.load();
      if (stats_.first_error.empty()) stats_.first_error = "unfinished: streams still open at the run's deadline";
    });
    work_.reset();
    // Exchanges left (timed-out servers) would keep run() going; stop it.
    asio::post(io_, [this] { io_.stop(); });
    if (thread_.joinable()) thread_.join();
    return std::move(stats_);
  }

 private:
  Clock::time_point due(int64_t j) const {
    return plan_.start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(j / plan_.rate));
  }

  void schedule() {
    if (next_ >= plan_.total) {
      all_sent_.store(true);
      return;
    }
    timer_.expires_at(due(next_));
    timer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      // Send everything due (more than one when this thread fell behind).
      const Clock::time_point now = Clock::now();
      while (next_ < plan_.total && due(next_) <= now) {
        send(next_, now);
        next_ += plan_.lanes;
      }
      schedule();
    });
  }

  struct Stream {
    int64_t sent_ns = 0;
    int64_t first_ns = -1;
    int status = 0;
    int events = 0;
    bool done = false;
    std::string bad;  // what made the stream bad, if anything
    std::unique_ptr<SseParser> sse;
  };

  void send(int64_t j, Clock::time_point now) {
    stats_.lag_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now - due(j)).count());
    ++stats_.requests;
    ++open_;
    concurrency_.up();
    auto stream = std::make_shared<Stream>();
    stream->sent_ns = ns_of(now);
    Stream* s = stream.get();  // the exchange's on_done holds the stream
    stream->sse = std::make_unique<SseParser>([this, s](std::string_view data) {
      if (data == "[DONE]") {
        s->done = true;
        return;
      }
      const size_t at = data.rfind("\"sent_ns\":");
      if (at == std::string_view::npos) {
        if (s->bad.empty()) s->bad = "an event without sent_ns: " + std::string(data.substr(0, 200));
        return;
      }
      const int64_t sent = std::strtoll(data.data() + at + 10, nullptr, 10);
      stats_.event_ns.push_back(arrival_ns_ - sent);
      stats_.event_at_ns.push_back(sent);
      if (s->first_ns < 0) s->first_ns = arrival_ns_;
      ++s->events;
    });
    OutgoingRequest req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
    req.body = fmt::format(R"({{"model":"bench","prompt":"{} {}","max_tokens":{},"stream":true}})", j,
                           plan_.prompt, plan_.events);
    ExchangeCallbacks c;
    c.on_head = [s](const IncomingHead& h) { s->status = h.status; };
    c.on_data = [this, s](std::string_view bytes) {
      arrival_ns_ = ns_of(Clock::now());
      if (s->status == 200 && !s->sse->feed(bytes) && s->bad.empty()) s->bad = "SSE: " + s->sse->error();
    };
    c.on_done = [this, stream](HttpFailure failure, const std::string& message) {
      end(*stream, failure, message);
    };
    clients_[static_cast<size_t>(j % static_cast<int64_t>(clients_.size()))]->send(std::move(req), std::move(c));
  }

  void end(Stream& s, HttpFailure failure, const std::string& message) {
    --open_;
    concurrency_.down();
    std::string kind, what;
    if (failure != HttpFailure::kNone) {
      kind = http_failure_name(failure);
      what = message;
    } else if (s.status != 200) {
      kind = "status";
      what = fmt::format("HTTP {}", s.status);
    } else if (!s.bad.empty()) {
      kind = "stream";
      what = s.bad;
    } else if (!s.done) {
      kind = "no_done";
      what = "the stream ended without data: [DONE]";
    } else if (s.events != plan_.events) {
      kind = "events";
      what = fmt::format("{} events, {} sent", s.events, plan_.events);
    }
    stats_.events += s.events;
    if (kind.empty()) {
      ++stats_.ok;
      stats_.ttft_ns.push_back(s.first_ns - s.sent_ns);
      return;
    }
    ++stats_.errors[kind];
    if (stats_.first_error.empty()) stats_.first_error = kind + ": " + what;
  }

  const Plan& plan_;
  Concurrency& concurrency_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  asio::steady_timer timer_;
  std::vector<std::unique_ptr<HttpClient>> clients_;
  std::thread thread_;
  int64_t next_ = 0;
  int64_t arrival_ns_ = 0;  // when the bytes being read arrived
  std::atomic<int64_t> open_{0};
  std::atomic<bool> all_sent_{false};
  LaneStats stats_;
};

// ---------------------------------------------------------------- a run

struct Percentiles {
  int64_t count = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;  // ms
};

Percentiles percentiles_ms(const std::vector<int64_t>& ns) {
  Percentiles p;
  p.count = static_cast<int64_t>(ns.size());
  if (ns.empty()) return p;
  std::vector<double> ms;
  ms.reserve(ns.size());
  for (int64_t v : ns) ms.push_back(static_cast<double>(v) / 1e6);
  std::sort(ms.begin(), ms.end());
  p.p50 = loadgen::percentile(ms, 50);
  p.p90 = loadgen::percentile(ms, 90);
  p.p99 = loadgen::percentile(ms, 99);
  p.p999 = loadgen::percentile(ms, 99.9);
  p.max = ms.back();
  return p;
}

Percentiles minus(const Percentiles& a, const Percentiles& b) {
  Percentiles d;
  d.count = a.count;
  d.p50 = a.p50 - b.p50;
  d.p90 = a.p90 - b.p90;
  d.p99 = a.p99 - b.p99;
  d.p999 = a.p999 - b.p999;
  d.max = a.max - b.max;
  return d;
}

json to_json(const Percentiles& p) {
  return {{"count", p.count}, {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"p99.9", p.p999}, {"max", p.max}};
}

// The gateway's own view of an event's time inside it: its histogram
// basalt_route_added_latency_seconds{kind="event"}, each percentile as the
// upper bound of the bucket it falls in (ms; +inf past the last bound).
struct Residence {
  int64_t count = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0;
};

std::optional<Residence> residence_of(const std::string& metrics) {
  std::vector<std::pair<double, double>> buckets;  // (le in ms, cumulative count)
  for (const router::PrometheusSample& sample : router::read_prometheus_text(metrics).samples) {
    if (sample.name != "basalt_route_added_latency_seconds_bucket") continue;
    std::string kind, le;
    for (const auto& [name, value] : sample.labels) {
      if (name == "kind") kind = value;
      if (name == "le") le = value;
    }
    if (kind != "event" || le.empty()) continue;
    buckets.emplace_back(le == "+Inf" ? INFINITY : std::atof(le.c_str()) * 1e3, sample.value);
  }
  if (buckets.empty()) return std::nullopt;
  std::sort(buckets.begin(), buckets.end());
  Residence r;
  r.count = static_cast<int64_t>(buckets.back().second);
  auto bound = [&](double p) {
    for (const auto& [le, cumulative] : buckets)
      if (cumulative >= p / 100 * static_cast<double>(r.count)) return le;
    return static_cast<double>(INFINITY);
  };
  r.p50 = bound(50);
  r.p90 = bound(90);
  r.p99 = bound(99);
  r.p999 = bound(99.9);
  return r;
}

struct RunResult {
  std::string name;
  double wall_s = 0;
  int64_t requests = 0, ok = 0, events = 0, errors = 0;
  std::map<std::string, int64_t> errors_by_kind;
  std::string first_error;
  int64_t peak_streams = 0;
  Percentiles event, ttft, client_lag, replica_lag;
  std::vector<Percentiles> timeline;  // the events sent in each second of the run
  double client_cpu_s = 0;
  double gateway_cpu_s = -1;  // -1: no gateway in this run
  int64_t replica_streams = 0, replica_streams_via_gateway = 0;
  std::optional<Residence> residence;  // through the gateway, when its /metrics has the histogram
};

RunResult run_load(const std::string& name, const Flags& f, const std::vector<std::string>& targets,
                   const std::vector<int>& client_cpus, int lanes, ReplicaSide& side, const Gateway* gateway) {
  Lane::Plan plan;
  plan.targets = targets;
  plan.rate = f.rate;
  plan.total = std::max<int64_t>(1, std::llround(f.rate * f.duration));
  plan.lanes = lanes;
  plan.events = f.events;
  plan.timeout_s = f.events * f.interval_ms / 1000.0 + 60;
  plan.prompt = std::string(static_cast<size_t>(f.prompt_bytes), 'x');
  for (size_t i = 0; i < plan.prompt.size(); ++i) plan.prompt[i] = "the quick brown fox jumps over a lazy dog "[i % 42];
  plan.cpus = client_cpus;

  Concurrency concurrency;
  std::vector<int64_t> discarded;
  side.take_lags(discarded);
  const int64_t streams0 = side.streams.load(), resumable0 = side.resumable.load();
  const double gateway_cpu0 = gateway ? gateway->cpu_seconds() : 0;
  plan.start = Clock::now() + std::chrono::milliseconds(200);
  std::vector<std::unique_ptr<Lane>> all;
  for (int i = 0; i < lanes; ++i) all.push_back(std::make_unique<Lane>(i, plan, concurrency));
  for (auto& lane : all) lane->start();

  // Arrivals, then every stream's end (or its timeout, and a margin).
  const auto deadline = plan.start + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(f.duration + plan.timeout_s + 5));
  int64_t last_report = 0;
  while (Clock::now() < deadline) {
    if (std::all_of(all.begin(), all.end(), [](const auto& l) { return l->finished(); })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto elapsed = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - plan.start).count();
    if (elapsed >= last_report + 5) {
      last_report = elapsed;
      std::fprintf(stderr, "  %s: %llds, %lld streams open\n", name.c_str(), static_cast<long long>(elapsed),
                   static_cast<long long>(concurrency.open.load()));
    }
  }
  RunResult r;
  r.name = name;
  r.wall_s = std::chrono::duration<double>(Clock::now() - plan.start).count();
  LaneStats total;
  for (auto& lane : all) {
    LaneStats s = lane->stop();
    total.event_ns.insert(total.event_ns.end(), s.event_ns.begin(), s.event_ns.end());
    total.event_at_ns.insert(total.event_at_ns.end(), s.event_at_ns.begin(), s.event_at_ns.end());
    total.ttft_ns.insert(total.ttft_ns.end(), s.ttft_ns.begin(), s.ttft_ns.end());
    total.lag_ns.insert(total.lag_ns.end(), s.lag_ns.begin(), s.lag_ns.end());
    total.requests += s.requests;
    total.ok += s.ok;
    total.events += s.events;
    for (const auto& [kind, n] : s.errors) total.errors[kind] += n;
    if (total.first_error.empty()) total.first_error = s.first_error;
    total.cpu_s += s.cpu_s;
  }
  all.clear();  // closes the clients' connections
  r.requests = total.requests;
  r.ok = total.ok;
  r.events = total.events;
  r.errors_by_kind = total.errors;
  for (const auto& [kind, n] : total.errors) r.errors += n;
  r.first_error = total.first_error;
  r.peak_streams = concurrency.peak.load();
  r.event = percentiles_ms(total.event_ns);
  // Per second of the run, by when the replica sent the event.
  std::vector<std::vector<int64_t>> seconds;
  for (size_t i = 0; i < total.event_ns.size(); ++i) {
    const int64_t second = (total.event_at_ns[i] - ns_of(plan.start)) / 1000000000;
    if (second < 0) continue;
    if (seconds.size() <= static_cast<size_t>(second)) seconds.resize(static_cast<size_t>(second) + 1);
    seconds[static_cast<size_t>(second)].push_back(total.event_ns[i]);
  }
  for (const std::vector<int64_t>& in_second : seconds) r.timeline.push_back(percentiles_ms(in_second));
  r.ttft = percentiles_ms(total.ttft_ns);
  r.client_lag = percentiles_ms(total.lag_ns);
  std::vector<int64_t> replica_lags;
  side.take_lags(replica_lags);
  r.replica_lag = percentiles_ms(replica_lags);
  r.client_cpu_s = total.cpu_s;
  if (gateway) {
    r.gateway_cpu_s = gateway->cpu_seconds() - gateway_cpu0;
    std::string metrics;
    if (http_status(gateway->url(), "/metrics", 5.0, &metrics) == 200) r.residence = residence_of(metrics);
  }
  r.replica_streams = side.streams.load() - streams0;
  r.replica_streams_via_gateway = side.resumable.load() - resumable0;
  return r;
}

// ---------------------------------------------------------------- report

json run_json(const RunResult& r) {
  json j = {{"wall_s", r.wall_s},
            {"requests", r.requests},
            {"ok", r.ok},
            {"events", r.events},
            {"errors", r.errors},
            {"errors_by_kind", r.errors_by_kind},
            {"peak_streams", r.peak_streams},
            {"event_ms", to_json(r.event)},
            {"ttft_ms", to_json(r.ttft)},
            {"client_lag_ms", to_json(r.client_lag)},
            {"replica_lag_ms", to_json(r.replica_lag)},
            {"client_cpu_s", r.client_cpu_s},
            {"replica_streams", r.replica_streams},
            {"replica_streams_via_gateway", r.replica_streams_via_gateway}};
  json timeline = json::array();
  for (const Percentiles& p : r.timeline) timeline.push_back(to_json(p));
  j["event_ms_by_second"] = std::move(timeline);
  if (!r.first_error.empty()) j["first_error"] = r.first_error;
  if (r.gateway_cpu_s >= 0) j["gateway_cpu_s"] = r.gateway_cpu_s;
  if (r.residence) {
    const auto le = [](double ms) { return std::isinf(ms) ? json("+Inf") : json(ms); };
    j["gateway_residence_ms_le"] = {{"count", r.residence->count}, {"p50", le(r.residence->p50)},
                                    {"p90", le(r.residence->p90)},   {"p99", le(r.residence->p99)},
                                    {"p99.9", le(r.residence->p999)}};
  }
  return j;
}

std::string row(const std::string& label, const Percentiles& p) {
  return fmt::format("  {:<22}{:>10.3f}{:>10.3f}{:>10.3f}{:>10.3f}{:>10.3f}\n", label, p.p50, p.p90, p.p99, p.p999,
                     p.max);
}

std::string table(const std::vector<RunResult>& runs, const std::string& setup) {
  std::string t = setup;
  const std::string head = fmt::format("  {:<22}{:>10}{:>10}{:>10}{:>10}{:>10}\n", "", "p50", "p90", "p99", "p99.9", "max");
  const RunResult* direct = nullptr;
  const RunResult* gateway = nullptr;
  for (const RunResult& r : runs) (r.name == "direct" ? direct : gateway) = &r;
  t += "\nper-event latency, ms (receive - sent_ns)\n" + head;
  for (const RunResult& r : runs) t += row(r.name, r.event);
  if (direct && gateway) t += row("added by the gateway", minus(gateway->event, direct->event));
  for (const RunResult& r : runs) {
    if (r.timeline.size() > 120) continue;
    t += fmt::format("  {} P99 by second:", r.name);
    for (const Percentiles& p : r.timeline) t += fmt::format(" {:.2f}", p.p99);
    t += "\n";
  }
  for (const RunResult& r : runs) {
    if (!r.residence) continue;
    const auto le = [](double ms) { return std::isinf(ms) ? std::string("inf") : fmt::format("{:g}", ms); };
    t += fmt::format(
        "  the gateway's own histogram of an event's time inside it (basalt_route_added_latency_seconds), "
        "{} events: p50 <= {}, p90 <= {}, p99 <= {}, p99.9 <= {} ms\n",
        r.residence->count, le(r.residence->p50), le(r.residence->p90), le(r.residence->p99), le(r.residence->p999));
  }
  t += "\nTTFT, ms (request handed to the client - first event)\n" + head;
  for (const RunResult& r : runs) t += row(r.name, r.ttft);
  if (direct && gateway) t += row("added by the gateway", minus(gateway->ttft, direct->ttft));
  t += "\nthe load's own figures, ms\n" + head;
  for (const RunResult& r : runs) t += row(r.name + ": client lag", r.client_lag);
  for (const RunResult& r : runs) t += row(r.name + ": replica lag", r.replica_lag);
  t += fmt::format("\n  {:<10}{:>10}{:>10}{:>8}{:>10}{:>8}{:>13}{:>13}{:>13}\n", "run", "requests", "ok", "errors",
                   "events", "peak", "client CPU", "gateway CPU", "gateway CPU");
  t += fmt::format("  {:<10}{:>10}{:>10}{:>8}{:>10}{:>8}{:>13}{:>13}{:>13}\n", "", "", "", "", "", "streams", "s",
                   "s (cores)", "ms/request");
  for (const RunResult& r : runs) {
    const bool g = r.gateway_cpu_s >= 0;
    t += fmt::format("  {:<10}{:>10}{:>10}{:>8}{:>10}{:>8}{:>13.2f}{:>13}{:>13}\n", r.name, r.requests, r.ok,
                     r.errors, r.events, r.peak_streams, r.client_cpu_s,
                     g ? fmt::format("{:.2f} ({:.2f})", r.gateway_cpu_s, r.gateway_cpu_s / r.wall_s) : "-",
                     g && r.requests > 0 ? fmt::format("{:.3f}", r.gateway_cpu_s * 1e3 / static_cast<double>(r.requests))
                                         : "-");
    if (r.errors > 0) {
      std::string kinds;
      for (const auto& [kind, n] : r.errors_by_kind) kinds += fmt::format(" {}={}", kind, n);
      t += fmt::format("    errors:{}; first: {}\n", kinds, r.first_error);
    }
  }
  for (const RunResult& r : runs)
    if (r.client_lag.p99 > 1 || r.replica_lag.p99 > 1)
      t += fmt::format(
          "\nnote: in the {} run the load generator or the fake replica ran late (lag P99 {:.2f} and {:.2f} ms): "
          "the machine was short of CPU, and the latencies hold that noise too\n",
          r.name, r.client_lag.p99, r.replica_lag.p99);
  if (direct && gateway) {
    const Percentiles e = minus(gateway->event, direct->event), s = minus(gateway->ttft, direct->ttft);
    t += fmt::format("\nP99 added: {:.3f} ms per event, {:.3f} ms to the first event (target: < 1 ms each)\n", e.p99,
                     s.p99);
  }
  return t;
}

fs::path default_basalt() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "basalt";
  return self.parent_path().parent_path() / "bin" / "basalt";
}

int run(int argc, char** argv) {
  Flags f = parse_flags(argc, argv);
  if (f.basalt.empty()) f.basalt = default_basalt().string();
  // The replicas' threads inherit this thread's CPUs; the gateway, the
  // CPUs this process started with (unless taskset says otherwise).
  cpu_set_t original;
  CPU_ZERO(&original);
  pthread_getaffinity_np(pthread_self(), sizeof original, &original);
  const std::vector<int> replica_cpus = cpus_of(f.replica_cpus, "--replica-cpus", original);
  const std::vector<int> client_cpus = cpus_of(f.client_cpus, "--client-cpus", original);
  cpus_of(f.gateway_cpus, "--gateway-cpus", original);
  const bool with_gateway = f.mode != "direct";
  if (with_gateway)
    BASALT_CHECK(::access(f.basalt.c_str(), X_OK) == 0, "--basalt {}: not an executable file", f.basalt);
  const int replica_threads =
      f.replica_threads > 0 ? f.replica_threads : replica_cpus.empty() ? 2 : static_cast<int>(replica_cpus.size());
  const int lanes = f.load_threads > 0 ? f.load_threads : client_cpus.empty() ? 2 : static_cast<int>(client_cpus.size());

  // Every stream is two sockets here through the gateway (the client's end
  // and the replica's), and more while closed ones linger.
  const uint64_t files = raise_open_file_limit();
  // Little's law, while arrivals last longer than a stream; else all of them.
  const double streams = f.rate * std::min(f.duration, f.events * f.interval_ms / 1000.0);
  const double wanted = 2.2 * streams + 256;
  if (static_cast<double>(files) < wanted)
    std::fprintf(stderr,
                 "warning: the open-file limit is %llu, and about %.0f descriptors are needed for %.0f streams; "
                 "raise the hard limit (ulimit -Hn) or lower --rate\n",
                 static_cast<unsigned long long>(files), wanted, streams);
  // Sized now rather than doubling during the ramp (core/file_limit.h); the
  // gateway does the same for its --max-connections.
  reserve_descriptor_table(std::min(static_cast<uint64_t>(files), static_cast<uint64_t>(wanted)));
  ::signal(SIGPIPE, SIG_IGN);

  ReplicaSide side;
  side.events = f.events;
  side.interval = std::chrono::milliseconds(f.interval_ms);
  auto timer_work = asio::make_work_guard(side.timers);
  std::vector<std::thread> timer_threads;
  std::vector<std::unique_ptr<FakeReplica>> replicas;
  pin_this_thread(replica_cpus);
  for (int i = 0; i < std::max(1, replica_threads / 2); ++i) timer_threads.emplace_back([&side] { side.timers.run(); });
  for (int i = 0; i < f.replicas; ++i) replicas.push_back(std::make_unique<FakeReplica>(side, replica_threads));
  pthread_setaffinity_np(pthread_self(), sizeof original, &original);
  std::vector<std::string> replica_urls;
  for (const auto& r : replicas) replica_urls.push_back(r->url());

  std::unique_ptr<Gateway> gateway;
  fs::path log_path = f.gateway_log;
  fs::path temp_dir;
  if (with_gateway) {
    if (log_path.empty()) {
      std::string pattern = (fs::temp_directory_path() / "basalt_route_overhead_XXXXXX").string();
      BASALT_CHECK(::mkdtemp(pattern.data()) != nullptr, "mkdtemp: {}", std::strerror(errno));
      temp_dir = pattern;
      log_path = temp_dir / "gateway.log";
    }
    gateway = std::make_unique<Gateway>(f, replica_urls, log_path);
    gateway->wait_ready(30);
  }

  std::string setup = fmt::format(
      "basalt_bench_route_overhead: {:g} req/s for {:g} s, {} events {} ms apart ({:.0f} streams at the peak), "
      "{} fake replica{} ({} I/O threads{}), {} load threads{}\n",
      f.rate, f.duration, f.events, f.interval_ms, streams, f.replicas, f.replicas == 1 ? "" : "s", replica_threads,
      f.replica_cpus.empty() ? "" : ", CPUs " + f.replica_cpus, lanes,
      f.client_cpus.empty() ? "" : ", CPUs " + f.client_cpus);
  if (gateway) setup += fmt::format("gateway: {} (log {})\n", gateway->command(), log_path.string());
  std::fputs(setup.c_str(), stderr);

  std::vector<RunResult> runs;
  if (f.mode != "gateway") {
    std::fprintf(stderr, "direct run\n");
    runs.push_back(run_load("direct", f, replica_urls, client_cpus, lanes, side, nullptr));
  }
  if (gateway) {
    if (!runs.empty()) std::this_thread::sleep_for(std::chrono::seconds(1));  // let closed sockets settle
    std::fprintf(stderr, "through the gateway\n");
    runs.push_back(run_load("gateway", f, {gateway->url()}, client_cpus, lanes, side, gateway.get()));
  }
  double gateway_rss = 0;
  if (gateway) {
    gateway_rss = gateway->peak_rss_mib();
    gateway->stop();
  }
  replicas.clear();
  timer_work.reset();
  side.timers.stop();
  for (std::thread& t : timer_threads) t.join();

  int64_t errors = 0;
  for (const RunResult& r : runs) errors += r.errors;
  if (gateway) setup += fmt::format("gateway peak RSS: {:.1f} MiB\n", gateway_rss);
  const std::string text = table(runs, setup);
  if (f.json) {
    json out = {{"config",
                 {{"rate", f.rate},
                  {"duration_s", f.duration},
                  {"events", f.events},
                  {"interval_ms", f.interval_ms},
                  {"prompt_bytes", f.prompt_bytes},
                  {"replicas", f.replicas},
                  {"replica_threads", replica_threads},
                  {"load_threads", lanes},
                  {"gateway_cpus", f.gateway_cpus},
                  {"replica_cpus", f.replica_cpus},
                  {"client_cpus", f.client_cpus},
                  {"gateway_command", gateway ? gateway->command() : std::string()},
                  {"open_file_limit", files}}}};
    for (const RunResult& r : runs) out[r.name] = run_json(r);
    const RunResult* direct = nullptr;
    const RunResult* through = nullptr;
    for (const RunResult& r : runs) (r.name == "direct" ? direct : through) = &r;
    if (direct && through)
      out["added"] = {{"event_ms", to_json(minus(through->event, direct->event))},
                      {"ttft_ms", to_json(minus(through->ttft, direct->ttft))}};
    if (through) out["gateway_peak_rss_mib"] = gateway_rss;
    out["errors"] = errors;
    std::fputs(text.c_str(), stderr);
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::fputs(text.c_str(), stdout);
  }
  if (!temp_dir.empty() && errors == 0) {
    std::error_code ec;
    fs::remove_all(temp_dir, ec);
  }
  return errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace basalt

int main(int argc, char** argv) {
  try {
    return basalt::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "basalt_bench_route_overhead: %s\n", e.what());
    return 2;
  }
}
