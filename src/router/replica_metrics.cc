#include "router/replica_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

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
  return state.scraped.waiting + static_cast<double>(state.unanswered_since_scrape) >=
             options.max_waiting ||
         state.scraped.kv_usage >= options.max_kv_usage;
}

PrefillEstimate prefill_estimate(ReplicaState& state, std::chrono::steady_clock::time_point now,
                                 const ScrapeOptions& options, double average_prompt_tokens,
                                 double assumed_tokens_per_s) {
  std::lock_guard<std::mutex> lock(state.mu);
  PrefillEstimate e;
  const double requests = fresh(state.scraped, now, options)
                              ? state.scraped.waiting + static_cast<double>(state.unanswered_since_scrape)
                              : static_cast<double>(state.in_flight.load());
  e.pending_tokens = requests * std::max(0.0, average_prompt_tokens);
  e.tokens_per_s = state.scraped.prefill_capacity_per_s > 0 ? state.scraped.prefill_capacity_per_s
                                                            : assumed_tokens_per_s;
  return e;
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
  const bool busy = (s.valid && s.waiting > 0) || *load->waiting > 0;
  if (s.prefill_tokens_delta > 0 && busy) {
    constexpr double kWeight = 0.3;  // of the newest sample: about the last three scrapes
    s.prefill_capacity_per_s = s.prefill_capacity_per_s < 0
                                   ? s.prefill_tokens_per_s
                                   : kWeight * s.prefill_tokens_per_s + (1 - kWeight) * s.prefill_capacity_per_s;
  }
  s.valid = true;
  s.at = now;
  s.waiting = *load->waiting;
  s.running = *load->running;
  s.kv_usage = *load->kv_usage;
  state.sent_since_scrape = 0;
  state.unanswered_since_scrape = 0;
  ++state.scrape_generation;
}

MetricsScraper::MetricsScraper(ReplicaRegistry& registry, boost::asio::io_context& io,
                               ScrapeOptions options)
    // A replica's metrics are some kB; more (up to 4 MiB) is not read.
    : poller_(registry, io, PollOptions{"/metrics", options.interval, options.timeout, 4 << 20},
              [](ReplicaState& state, const std::optional<PollAnswer>& answer) {
                std::optional<ReplicaLoad> load;
                if (answer && answer->status == 200) load = replica_load(read_prometheus_text(answer->body));
                record(state, load, std::chrono::steady_clock::now());
              }) {}

}  // namespace basalt::router
