#include "sim/fleet.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "loadgen/schedule.h"

namespace basalt::sim {
namespace {

// A replica that serves one request at a time in one step of
// fixed_ms + prompt / rate (output 1 token: no decode).
StepTable fixed_service(double prefill_fixed_ms, double prefill_tokens_per_s, int64_t max_running = 1) {
  StepTable t;
  t.name = "fixed";
  t.decode_ms = {{1, 10}};
  t.prefill_fixed_ms = prefill_fixed_ms;
  t.prefill_tokens_per_s = prefill_tokens_per_s;
  t.max_running = max_running;
  t.step_token_budget = 4096;
  t.kv_capacity_tokens = 1 << 20;
  return t;
}

std::vector<SimRequest> poisson(int64_t n, loadgen::LoadShape shape, int64_t prompt, int64_t output) {
  std::vector<SimRequest> out;
  for (double t : loadgen::arrival_times(n, shape)) out.push_back({t, prompt, output});
  return out;
}

// M/D/1: Poisson arrivals, a deterministic service time S, one server. The
// mean wait in queue is rho S / (2 (1 - rho)) (Pollaczek-Khinchine).
TEST(Fleet, OneReplicaWithAFixedStepTimeWaitsAsMD1) {
  FleetConfig c;
  c.table = fixed_service(20, 1000);  // 20 ms + 80 tokens: S = 100 ms
  const double service_s = 0.1;
  for (double rho : {0.5, 0.8}) {
    const std::vector<SimRequest> q = poisson(40000, {rho / service_s, 11}, 80, 1);
    const SimResult r = simulate(c, q);
    ASSERT_EQ(r.completed, 40000);
    const double wait_s = rho * service_s / (2 * (1 - rho));
    EXPECT_NEAR(r.ttft_ms.mean / 1000, service_s + wait_s, 0.05 * (service_s + wait_s)) << "rho " << rho;
    EXPECT_NEAR(r.ttft_ms.min, 100, 1e-6);
    EXPECT_NEAR(r.request_throughput, rho / service_s, 0.03 * rho / service_s);
  }
}

TEST(Fleet, DecodeStepsGiveTheTableItl) {
  FleetConfig c;
  c.table = fixed_service(0, 1000, 4);
  c.table.decode_ms = {{1, 10}, {4, 16}};
  // Four requests at once: the first starts a step alone (50 tokens: 50 ms),
  // the other three prefill in the next one beside its first decode token
  // (10 + 150 ms), then 8 steps of batch 4 (16 ms) end the first request and
  // one of batch 3 (14 ms, interpolated) the others.
  std::vector<SimRequest> q(4, SimRequest{0, 50, 10});
  const SimResult r = simulate(c, q);
  EXPECT_NEAR(r.ttft_ms.min, 50, 1e-6);
  EXPECT_NEAR(r.ttft_ms.max, 210, 1e-6);
  EXPECT_NEAR(r.itl_ms.median, 16, 1e-6);
  EXPECT_EQ(r.itl_ms.count, 4 * 9);
  EXPECT_NEAR(r.e2e_ms.min, 210 + 8 * 16, 1e-6);
  EXPECT_NEAR(r.e2e_ms.max, 210 + 8 * 16 + 14, 1e-6);
  EXPECT_NEAR(r.output_throughput, 40 / 0.352, 1e-6);
}

// A burst of 4x for 10 s over a replica that serves 10 requests/s, fed 5/s:
// about (20 - 10) x 10 = 100 requests pile up, the last of the burst waits
// about 10 s, and the backlog drains at 10 - 5 = 5 requests/s afterwards.
TEST(Fleet, BurstPilesUpAndDrains) {
  FleetConfig c;
  c.table = fixed_service(20, 1000);
  loadgen::LoadShape shape{5, 3, 4, 20, 10};
  const std::vector<SimRequest> q = poisson(600, shape, 80, 1);  // about 110 s
  const SimResult r = simulate(c, q);
  EXPECT_EQ(r.completed, 600);
  int64_t in_burst = 0;
  for (const SimRequest& x : q) in_burst += x.arrival_s >= 20 && x.arrival_s < 30 ? 1 : 0;
  EXPECT_GT(in_burst, 160);
  EXPECT_NEAR(r.max_replica_queue, in_burst - 100, 15);
  EXPECT_GT(r.ttft_ms.max, 7000);
  EXPECT_LT(r.ttft_ms.max, 14000);
  // Without the burst the same replica keeps TTFT near S.
  shape.burst_factor = 1;
  const SimResult calm = simulate(c, poisson(600, shape, 80, 1));
  EXPECT_LT(calm.ttft_ms.p99, 1000);
  EXPECT_LT(calm.max_replica_queue, 10);
  // Well after the burst (its backlog gone by ~50 s) requests are fast again.
  const std::vector<SimRequest> all = poisson(600, {5, 3, 4, 20, 10}, 80, 1);
  FleetConfig one = c;
  one.slo_ttft_ms = 1000;
  const SimResult burst = simulate(one, all);
  int64_t after = 0;
  for (const SimRequest& x : all) after += x.arrival_s > 70 ? 1 : 0;
  EXPECT_GE(burst.slo_attainment * 600, static_cast<double>(after) - 5);
}

FleetConfig from_zero(double cold_start_s, double deadline_s) {
  FleetConfig c;
  c.table = fixed_service(20, 1000, 8);
  c.replicas = 0;
  router::AutoscaleConfig a;
  a.metric = router::AutoscaleMetric::kConcurrency;
  a.target = 1;
  a.min_replicas = 0;
  a.max_replicas = 4;
  a.up_after_s = 10;
  a.down_after_s = 30;
  c.autoscale = a;
  c.cold_start_s = cold_start_s;
  c.queue_deadline_s = deadline_s;
  c.timeline = true;
  return c;
}

TEST(Fleet, AutoscalerScalesFromZeroAfterAColdStart) {
  const std::vector<SimRequest> q = poisson(120, {2, 5}, 80, 1);  // about 60 s at 2/s, S = 100 ms
  const SimResult r = simulate(from_zero(30, 300), q);
  EXPECT_EQ(r.completed, 120);
  EXPECT_EQ(r.failed, 0);
  EXPECT_GE(r.cold_starts, 1);
  // The first request waited for the cold start: its TTFT is 30 s minus its
  // arrival's distance to the next evaluation, plus its service.
  EXPECT_GT(r.ttft_ms.max, 29000);
  EXPECT_LT(r.ttft_ms.max, 31200);
  EXPECT_GT(r.max_gateway_queue, 40);  // the requests of the first 30 s, held in the gateway
  // Nothing ready before 30 s; the GPU time starts at the first request.
  ASSERT_FALSE(r.timeline.empty());
  for (const TimelinePoint& p : r.timeline)
    if (p.t_s < 30) {
      EXPECT_EQ(p.ready, 0) << p.t_s;
    }
  EXPECT_LT(r.gpu_hours * 3600, r.cold_starts * r.duration_s);
}

TEST(Fleet, ColdStartLongerThanTheQueueDeadlineFailsRequests) {
  const std::vector<SimRequest> q = poisson(120, {2, 5}, 80, 1);
  const SimResult r = simulate(from_zero(30, 10), q);
  EXPECT_GT(r.failed, 20);  // those that arrived more than 10 s before the replica was ready
  EXPECT_EQ(r.failed + r.completed, 120);
  EXPECT_LT(r.slo_attainment, 1.0 - 20.0 / 120);
}

// With details, every request in arrival order, their TTFTs those the
// summary is made of; failed ones marked.
TEST(Fleet, DetailsListEveryRequest) {
  const std::vector<SimRequest> q = poisson(120, {2, 5}, 80, 1);
  FleetConfig c = from_zero(30, 10);
  EXPECT_TRUE(simulate(c, q).details.empty());
  c.detailed = true;
  const SimResult r = simulate(c, q);
  ASSERT_EQ(r.details.size(), q.size());
  int64_t failed = 0;
  double slowest = 0;
  for (size_t k = 0; k < q.size(); ++k) {
    const loadgen::RequestDetail& d = r.details[k];
    EXPECT_EQ(d.index, static_cast<int64_t>(k));
    EXPECT_DOUBLE_EQ(d.scheduled_s, q[k].arrival_s);
    EXPECT_EQ(d.input_tokens, 80);
    if (!d.error.empty()) {
      ++failed;
      EXPECT_EQ(d.ttft_ms, -1);
      continue;
    }
    EXPECT_EQ(d.output_tokens, 1);
    EXPECT_GE(d.e2e_ms, d.ttft_ms);
    slowest = std::max(slowest, d.ttft_ms);
  }
  EXPECT_EQ(failed, r.failed);
  EXPECT_GT(failed, 0);
  EXPECT_DOUBLE_EQ(slowest, r.ttft_ms.max);
  EXPECT_EQ(sim_result_json(r)["details"].size(), q.size());
}

TEST(Fleet, AutoscalerFollowsLoadUpAndDown) {
  FleetConfig c = from_zero(5, 300);
  c.replicas = 1;
  c.autoscale->min_replicas = 1;
  // 8/s of 1 s service (so 8 replicas' worth at one request each) for 100 s,
  // then 0.5/s: up to the max (4), then down one step per down_after.
  c.table = fixed_service(0, 100, 1);
  std::vector<SimRequest> q = poisson(800, {8, 1}, 100, 1);
  const double end = q.back().arrival_s;
  for (double t : loadgen::arrival_times(100, {0.5, 2})) q.push_back({end + t, 100, 1});
  const SimResult r = simulate(c, q);
  EXPECT_EQ(r.max_replicas, 4);
  EXPECT_EQ(r.cold_starts, 3);
  int64_t last_ready = 0;
  for (const TimelinePoint& p : r.timeline) last_ready = p.ready;
  EXPECT_LT(last_ready, 4);
}

// Many groups, each replica's KV holding about a quarter of them: cache-aware
// routing keeps each group on one replica, round-robin spreads every group
// over every replica and its LRU thrashes.
TEST(Fleet, CacheAwareRoutingHitsThePrefixCacheMoreThanRoundRobin) {
  FleetConfig c;
  c.table = fixed_service(5, 20000, 16);
  c.table.kv_capacity_tokens = 60000;  // about 55 prefixes of 1,000 tokens
  c.replicas = 4;
  std::mt19937_64 rng(4);
  std::vector<SimRequest> q;
  for (double t : loadgen::arrival_times(6000, {40, 8})) {
    const int64_t group = static_cast<int64_t>(rng() % 200);
    q.push_back({t, 1050, 1, group, 1000});
  }
  c.policy = router::Policy::kCacheAware;
  const SimResult aware = simulate(c, q);
  c.policy = router::Policy::kRoundRobin;
  const SimResult rr = simulate(c, q);
  EXPECT_GT(aware.prefix_hit_rate, 0.75);
  EXPECT_LT(rr.prefix_hit_rate, 0.4);
  EXPECT_LT(aware.ttft_ms.median, rr.ttft_ms.median);
}

TEST(Fleet, TheSameInputGivesTheSameResult) {
  FleetConfig c = from_zero(10, 300);
  c.policy = router::Policy::kPowerOfTwo;
  const std::vector<SimRequest> q = poisson(300, {5, 7}, 80, 4);
  EXPECT_EQ(sim_result_json(simulate(c, q)).dump(), sim_result_json(simulate(c, q)).dump());
}

TEST(Fleet, RefusesBadInput) {
  FleetConfig c;
  c.table = fixed_service(1, 1000);
  EXPECT_THROW(simulate(c, {{1, 10, 1}, {0.5, 10, 1}}), Error);     // unsorted
  EXPECT_THROW(simulate(c, {{0, 10, 0}}), Error);                   // no output
  EXPECT_THROW(simulate(c, {{0, 10, 1, 0, 10}}), Error);            // prefix = prompt
  EXPECT_THROW(simulate(c, {{0, 1 << 20, 1}}), Error);              // past the KV pool
  c.replicas = 0;
  EXPECT_THROW(simulate(c, {{0, 10, 1}}), Error);                   // nothing would serve
}

}  // namespace
}  // namespace basalt::sim
