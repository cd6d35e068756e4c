// Replica metrics: a replica's own text read back, text missing numbers; a
// scrape's bookkeeping, load and saturation on a test clock; the scraper
// against a fake replica.
#include "router/replica_metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <cmath>
#include <mutex>
#include <thread>

#include "server/http_server.h"
#include "server/metrics_text.h"

namespace basalt::router {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// What `basalt serve` writes for a replica with 3 waiting, 2 running, a
// quarter of its KV used and 1000 prompt tokens computed.
std::string replica_text() {
  MetricsInput in;
  in.model_name = "basalt \"mini\"";
  in.engine.queued = 3;
  in.engine.running = 2;
  in.engine.kv_capacity = 4000;
  in.engine.kv_used = 1000;
  in.engine.prefill_tokens = 1000;
  in.http_requests[{"/v1/completions", 200}] = 7;
  return render_metrics(in);
}

TEST(PrometheusText, ReadsAReplicasOwnText) {
  const PrometheusRead read = read_prometheus_text(replica_text());
  EXPECT_EQ(read.bad_lines, 0u);
  ASSERT_GT(read.samples.size(), 10u);
  const auto waiting =
      std::find_if(read.samples.begin(), read.samples.end(),
                   [](const PrometheusSample& s) { return s.name == "basalt_requests_waiting"; });
  ASSERT_NE(waiting, read.samples.end());
  EXPECT_EQ(waiting->value, 3);
  ASSERT_EQ(waiting->labels.size(), 1u);
  EXPECT_EQ(waiting->labels[0].first, "model_name");
  EXPECT_EQ(waiting->labels[0].second, "basalt \"mini\"");  // unescaped
  const ReplicaLoad load = replica_load(read);
  ASSERT_TRUE(load.complete());
  EXPECT_EQ(*load.waiting, 3);
  EXPECT_EQ(*load.running, 2);
  EXPECT_DOUBLE_EQ(*load.kv_usage, 0.25);
  EXPECT_EQ(*load.prefill_tokens, 1000);
}

TEST(PrometheusText, ImplausibleOrMissingNumbersAreAbsent) {
  EXPECT_FALSE(replica_load(read_prometheus_text("other 1\n")).complete());
  const ReplicaLoad odd =
      replica_load(read_prometheus_text("basalt_requests_waiting -1\nbasalt_requests_running "
                                        "NaN\nbasalt_kv_cache_usage_ratio 1.5\n"));
  EXPECT_FALSE(odd.waiting);
  EXPECT_FALSE(odd.running);
  EXPECT_FALSE(odd.kv_usage);
  // vLLM's names when basalt's are missing; two models' series add up.
  const ReplicaLoad v = replica_load(read_prometheus_text(
      "vllm:num_requests_waiting{model_name=\"a\"} 2\nvllm:num_requests_waiting{model_name=\"b\"} "
      "3\n"
      "vllm:num_requests_running 1\nvllm:kv_cache_usage_perc{model_name=\"a\"} 0.5\n"
      "vllm:kv_cache_usage_perc{model_name=\"b\"} 0.7\n"));
  ASSERT_TRUE(v.complete());
  EXPECT_EQ(*v.waiting, 5);
  EXPECT_DOUBLE_EQ(*v.kv_usage, 0.7);
  EXPECT_FALSE(v.prefill_tokens);
}

ReplicaLoad load(double waiting, double running, double usage,
                 std::optional<double> prefill = std::nullopt) {
  ReplicaLoad l;
  l.waiting = waiting;
  l.running = running;
  l.kv_usage = usage;
  l.prefill_tokens = prefill;
  return l;
}

TEST(ReplicaMetrics, LoadAndSaturationFromAScrapeAndWhatWasSentSince) {
  ReplicaState state;
  ScrapeOptions o;
  auto t = Clock::now();
  // No scrape: the gateway's in-flight count, never saturated.
  const uint64_t before = state.attempt_started();
  EXPECT_EQ(load_of(state, t, o), 1);
  EXPECT_FALSE(saturated(state, t, o));
  MetricsScraper::record(state, load(2, 3, 0.1, 100), t);
  EXPECT_EQ(load_of(state, t, o), 5);
  state.attempt_ended(before);  // in the scrape's numbers already: no change
  EXPECT_EQ(load_of(state, t, o), 5);
  // Two sent since: counted until they end or the next scrape.
  const uint64_t g1 = state.attempt_started();
  state.attempt_started();
  EXPECT_EQ(load_of(state, t, o), 7);
  EXPECT_FALSE(saturated(state, t, o));  // waiting 2 + 2 sent < 5
  state.attempt_started();
  EXPECT_TRUE(saturated(state, t, o));  // 2 + 3 = 5
  state.attempt_ended(g1);
  EXPECT_FALSE(saturated(state, t, o));
  // A stream whose replica has begun answering is running there: still
  // load, no longer waiting.
  const uint64_t g2 = state.attempt_started();
  EXPECT_TRUE(saturated(state, t, o));  // 2 + 3 unanswered
  state.attempt_answering(g2);
  EXPECT_FALSE(saturated(state, t, o));  // 2 + 2
  EXPECT_EQ(load_of(state, t, o), 8);
  EXPECT_EQ(prefill_estimate(state, t, o, 100, 1).pending_tokens, 400);  // (2 + 2) x 100
  state.attempt_ended(g2, /*answering=*/true);
  EXPECT_EQ(load_of(state, t, o), 7);
  EXPECT_EQ(state.unanswered_since_scrape, 2);
  state.attempt_started();
  EXPECT_TRUE(saturated(state, t, o));
  // An attempt from before the scrape changes nothing once it answers.
  state.attempt_answering(before);
  EXPECT_TRUE(saturated(state, t, o));
  // KV usage past 0.8 saturates; the prefill counter gives a rate.
  t += 500ms;
  MetricsScraper::record(state, load(0, 1, 0.85, 600), t);
  EXPECT_TRUE(saturated(state, t, o));
  EXPECT_EQ(state.scraped.prefill_tokens_delta, 500);
  EXPECT_EQ(state.scraped.prefill_tokens_per_s, 1000);
  EXPECT_EQ(state.sent_since_scrape, 0);
  EXPECT_EQ(state.unanswered_since_scrape, 0);
  // A counter that went down is a restarted replica: no rate.
  t += 1s;
  MetricsScraper::record(state, load(0, 0, 0, 10), t);
  EXPECT_EQ(state.scraped.prefill_tokens_per_s, -1);
  // Stale after stale_after: the in-flight count again.
  EXPECT_EQ(load_of(state, t + o.stale_after + 1ms, o), state.in_flight.load());
  // A failed scrape invalidates at once.
  MetricsScraper::record(state, std::nullopt, t);
  EXPECT_FALSE(state.scraped.valid);
  EXPECT_EQ(state.scraped.failures, 1u);
  EXPECT_FALSE(saturated(state, t, o));
}

TEST(ReplicaMetrics, PrefillCapacityIsLearnedOnlyWhileRequestsWait) {
  ReplicaState state;
  ScrapeOptions o;
  auto t = Clock::now();
  MetricsScraper::record(state, load(0, 1, 0.1, 1000), t);
  // Idle: 100 tokens in a second is what it was asked, not what it can do.
  t += 1s;
  MetricsScraper::record(state, load(0, 1, 0.1, 1100), t);
  EXPECT_EQ(state.scraped.prefill_tokens_per_s, 100);
  EXPECT_EQ(state.scraped.prefill_capacity_per_s, -1);
  // Requests waiting at the end of the interval: 4000 tokens/s measured.
  t += 1s;
  MetricsScraper::record(state, load(3, 4, 0.5, 5100), t);
  EXPECT_EQ(state.scraped.prefill_capacity_per_s, 4000);
  // Waiting at its start: 2000 tokens/s, weighed 0.3 into the average.
  t += 1s;
  MetricsScraper::record(state, load(0, 4, 0.5, 7100), t);
  EXPECT_DOUBLE_EQ(state.scraped.prefill_capacity_per_s, 0.3 * 2000 + 0.7 * 4000);
  // A failed scrape keeps it.
  MetricsScraper::record(state, std::nullopt, t);
  EXPECT_DOUBLE_EQ(state.scraped.prefill_capacity_per_s, 3400);

  // The estimate: waiting + sent since the scrape, times the average prompt.
  ReplicaState fresh_state;
  EXPECT_EQ(prefill_estimate(fresh_state, t, o, 100, 2000).tokens_per_s, 2000);  // assumed until measured
  EXPECT_EQ(prefill_estimate(fresh_state, t, o, 100, 2000).pending_tokens, 0);
  fresh_state.attempt_started();  // no scrape: the in-flight count
  EXPECT_EQ(prefill_estimate(fresh_state, t, o, 100, 2000).pending_tokens, 100);
  MetricsScraper::record(fresh_state, load(4, 2, 0.1), t);
  fresh_state.attempt_started();
  const PrefillEstimate e = prefill_estimate(fresh_state, t, o, 100, 2000);
  EXPECT_EQ(e.pending_tokens, 500);  // (4 waiting + 1 sent) × 100
  EXPECT_EQ(e.tokens_per_s, 2000);
  EXPECT_DOUBLE_EQ(prefill_estimate(state, t, o, 100, 2000).tokens_per_s, 3400);
}

// A fake replica whose /metrics answers what `body` holds at the time.
class Scraper : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions options;
    options.port = 0;
    server_ = std::make_unique<HttpServer>(options, [this](HttpRequest& r) {
      HandlerResult h;
      std::lock_guard<std::mutex> lock(mu_);
      ++scrapes_;
      h.response.status = r.path == "/metrics" ? status_ : 404;
      h.response.body = body_;
      return h;
    });
    server_->start();
    registry_.set({parse_replica("http://127.0.0.1:" + std::to_string(server_->port()), "test")});
    work_.emplace(boost::asio::make_work_guard(io_));
    thread_ = std::thread([this] { io_.run(); });
    ScrapeOptions o;
    o.interval = 20ms;
    scraper_ = std::make_unique<MetricsScraper>(registry_, io_, o);
    scraper_->start();
  }
  void TearDown() override {
    scraper_.reset();
    server_->stop();
    work_.reset();
    io_.stop();
    thread_.join();
  }
  void answer(int status, std::string body) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    body_ = std::move(body);
  }
  // Waits until the replica's state satisfies `done`.
  bool until(const std::function<bool(const ScrapedLoad&)>& done) {
    const auto end = Clock::now() + 10s;
    while (Clock::now() < end) {
      ReplicaState& s = *registry_.snapshot()->replicas[0].state;
      {
        std::lock_guard<std::mutex> lock(s.mu);
        if (done(s.scraped)) return true;
      }
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }

  std::mutex mu_;
  int status_ = 200;
  std::string body_;
  int scrapes_ = 0;
  std::unique_ptr<HttpServer> server_;
  ReplicaRegistry registry_;
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::thread thread_;
  std::unique_ptr<MetricsScraper> scraper_;
};

TEST_F(Scraper, RecordsAReplicasNumbersAndForgetsThemOnGarbage) {
  answer(200, replica_text());
  EXPECT_TRUE(
      until([](const ScrapedLoad& s) { return s.valid && s.waiting == 3 && s.running == 2; }));
  answer(200, std::string("\x01\x02 garbage {{{\n", 16) + std::string(3000, 'x'));
  EXPECT_TRUE(until([](const ScrapedLoad& s) { return !s.valid; }));
  answer(200, replica_text());
  EXPECT_TRUE(until([](const ScrapedLoad& s) { return s.valid; }));
  answer(500, replica_text());  // numbers under an error status are not taken
  EXPECT_TRUE(until([](const ScrapedLoad& s) { return !s.valid; }));
  answer(200, "basalt_requests_waiting 1\n");  // running and usage missing
  const auto failures = [&] {
    ReplicaState& s = *registry_.snapshot()->replicas[0].state;
    std::lock_guard<std::mutex> lock(s.mu);
    return s.scraped.failures;
  };
  const uint64_t seen = failures();
  EXPECT_TRUE(until([&](const ScrapedLoad& s) { return !s.valid && s.failures > seen; }));
}

}  // namespace
}  // namespace basalt::router
