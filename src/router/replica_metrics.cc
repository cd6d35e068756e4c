#include "router/replica_metrics.h"

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include "server/http_client.h"

namespace basalt::router {
namespace {

// The sum (or the largest, `largest`) of a family's samples that hold a
// plausible value; none when no sample does.
std::optional<double> total(const PrometheusRead& read, std::string_view name, double max_value,
                            bool largest) {
  std::optional<double> out;
  for (const PrometheusSample& s : read.samples) {
    if (s.name != name || !std::isfinite(s.value) || s.value < 0 || s.value > max_value) continue;
    out = !out ? s.value : largest ? std::max(*out, s.value) : *out + s.value;
  }
  return out;
}

std::optional<double> first_of(const PrometheusRead& read, std::string_view name,
                               std::string_view other, double max_value, bool largest = false) {
  if (auto v = total(read, name, max_value, largest)) return v;
  return total(read, other, max_value, largest);
}

bool fresh(const ScrapedLoad& s, std::chrono::steady_clock::time_point now,
           const ScrapeOptions& options) {
  return s.valid && now - s.at <= options.stale_after;
}

}  // namespace

ReplicaLoad replica_load(const PrometheusRead& read) {
  constexpr double kMaxCount = 1e9;  // no replica queues more; a larger number is garbage
  ReplicaLoad load;
  load.waiting = first_of(read, "basalt_requests_waiting", "vllm:num_requests_waiting", kMaxCount);
  load.running = first_of(read, "basalt_requests_running", "vllm:num_requests_running", kMaxCount);
  load.kv_usage =
      first_of(read, "basalt_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", 1.0, true);
  load.prefill_tokens = total(read, "basalt_prefill_tokens_total", 1e18, false);
  return load;
}

int64_t load_of(ReplicaState& state, std::chrono::steady_clock::time_point now,
                const ScrapeOptions& options) {
  std::lock_guard<std::mutex> lock(state.mu);
  if (!fresh(state.scraped, now, options)) return state.in_flight.load();
  return static_cast<int64_t>(state.scraped.waiting + state.scraped.running) +
         state.sent_since_scrape;
}

bool saturated(ReplicaState& state, std::chrono::steady_clock::time_point now,
               const ScrapeOptions& options) {
  std::lock_guard<std::mutex> lock(state.mu);
  if (!fresh(state.scraped, now, options)) return false;
  return state.scraped.waiting + static_cast<double>(state.sent_since_scrape) >=
             options.max_waiting ||
         state.scraped.kv_usage >= options.max_kv_usage;
}

void MetricsScraper::record(ReplicaState& state, const std::optional<ReplicaLoad>& load,
                            std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(state.mu);
  ScrapedLoad& s = state.scraped;
  if (!load || !load->complete()) {
    s.valid = false;
    ++s.failures;
    return;
  }
  const double seconds = std::chrono::duration<double>(now - s.at).count();
  if (load->prefill_tokens && s.prefill_tokens >= 0 && *load->prefill_tokens >= s.prefill_tokens &&
      seconds > 0) {
    s.prefill_tokens_delta = *load->prefill_tokens - s.prefill_tokens;
    s.prefill_tokens_per_s = s.prefill_tokens_delta / seconds;
  } else {
    s.prefill_tokens_delta = s.prefill_tokens_per_s = -1;  // the first, or the replica restarted
  }
  s.prefill_tokens = load->prefill_tokens.value_or(-1);
  s.valid = true;
  s.at = now;
  s.waiting = *load->waiting;
  s.running = *load->running;
  s.kv_usage = *load->kv_usage;
  state.sent_since_scrape = 0;
  ++state.scrape_generation;
}

struct MetricsScraper::Impl : std::enable_shared_from_this<Impl> {
  ReplicaRegistry& registry;
  boost::asio::io_context& io;
  ScrapeOptions options;
  boost::asio::steady_timer timer;
  std::mutex mu;  // what follows
  bool stopped = false;
  std::map<std::string, std::unique_ptr<HttpClient>> clients;  // per replica
  std::set<std::string> scraping;                              // a scrape is out
  std::vector<ExchangeHandle> out;

  Impl(ReplicaRegistry& r, boost::asio::io_context& i, ScrapeOptions o)
      : registry(r), io(i), options(o), timer(i) {}

  void tick() {
    const std::shared_ptr<const Snapshot> snapshot = registry.snapshot();
    std::lock_guard<std::mutex> lock(mu);
    if (stopped) return;
    out.clear();
    for (const Replica& r : snapshot->replicas) {
      if (!scraping.insert(r.spec.id).second) continue;  // the last one is still out
      auto it = clients.find(r.spec.id);
      if (it == clients.end()) {
        HttpClientOptions o;
        o.timeout_s = std::chrono::duration<double>(options.timeout).count();
        o.max_body_bytes = 4 << 20;  // a replica's metrics are some kB; more is not read
        o.max_idle = 2;
        try {
          it = clients.emplace(r.spec.id, std::make_unique<HttpClient>(io, r.spec.url, o)).first;
        } catch (const std::exception&) {  // the host does not resolve
          scraping.erase(r.spec.id);
          MetricsScraper::record(*r.state, std::nullopt, std::chrono::steady_clock::now());
          continue;
        }
      }
      OutgoingRequest req;
      req.path = "/metrics";
      struct Answer {
        int status = 0;
        std::string body;
      };
      auto answer = std::make_shared<Answer>();
      ExchangeCallbacks c;
      c.on_head = [answer](const IncomingHead& h) { answer->status = h.status; };
      c.on_data = [answer](std::string_view bytes) { answer->body.append(bytes); };
      c.on_done = [weak = weak_from_this(), state = r.state, id = r.spec.id, answer](
                      HttpFailure f, const std::string&) {
        const auto self = weak.lock();
        if (!self) return;
        {
          std::lock_guard<std::mutex> lock(self->mu);
          self->scraping.erase(id);
          if (self->stopped || f == HttpFailure::kCancelled) return;
        }
        std::optional<ReplicaLoad> load;
        if (f == HttpFailure::kNone && answer->status == 200)
          load = replica_load(read_prometheus_text(answer->body));
        MetricsScraper::record(*state, load, std::chrono::steady_clock::now());
      };
      out.push_back(it->second->send(req, std::move(c)));
    }
    timer.expires_after(options.interval);
    timer.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      if (ec) return;
      if (const auto self = weak.lock()) self->tick();
    });
  }
};

MetricsScraper::MetricsScraper(ReplicaRegistry& registry, boost::asio::io_context& io,
                               ScrapeOptions options)
    : impl_(std::make_shared<Impl>(registry, io, options)) {}

MetricsScraper::~MetricsScraper() { stop(); }

void MetricsScraper::start() {
  boost::asio::post(impl_->io, [impl = impl_] { impl->tick(); });
}

void MetricsScraper::stop() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->timer.cancel();
  for (const ExchangeHandle& h : impl_->out) h.cancel();
}

}  // namespace basalt::router
