// The admission queue on a test clock: weighted fairness inside a class,
// strict priority between classes, concurrency, the saturation gate,
// max_queued and deadlines with their Retry-After.
#include "router/admission.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace basalt::router {
namespace {

using namespace std::chrono_literals;
using Clock = AdmissionQueue::Clock;

AdmissionRequest request(const std::string& tenant, int64_t cost, double weight = 1,
                         int priority = 0, const std::string& class_name = "c") {
  AdmissionRequest r;
  r.tenant = tenant;
  r.class_name = class_name;
  r.priority = priority;
  r.weight = weight;
  r.cost = cost;
  return r;
}

// A queue whose requests' gate is `open`, recording what each decision was.
struct Harness {
  AdmissionQueue queue;
  Clock::time_point now = Clock::now();
  bool open = true;
  int budget = -1;  // dispatches the gate still allows; -1: any number
  std::vector<std::pair<std::string, AdmissionDecision>> decided;  // (tenant, decision), in order
  std::map<std::string, int64_t> served;                           // dispatched cost per tenant

  void submit(AdmissionRequest r) {
    r.ready = [this] { return open && budget != 0; };
    const std::string tenant = r.tenant;
    const int64_t cost = r.cost;
    const auto refused = queue.submit(
        std::move(r), now,
        [this, tenant, cost](const AdmissionDecision& d) {
          decided.emplace_back(tenant, d);
          if (d.dispatched) {
            served[tenant] += cost;
            if (budget > 0) --budget;
          }
        },
        nullptr);
    if (refused) decided.emplace_back(tenant, *refused);
  }
  // Dispatches one request at most.
  void one() {
    budget = 1;
    queue.pump(now);
    budget = -1;
  }
};

TEST(AdmissionQueue, WeightsThreeToOneServeTokensThreeToOne) {
  Harness h;
  std::mt19937 rng(1);
  // Both tenants always backlogged, requests of mixed sizes.
  for (int i = 0; i < 12000; ++i) {
    h.submit(request("heavy", 20 + static_cast<int64_t>(rng() % 400), 3));
    h.submit(request("light", 20 + static_cast<int64_t>(rng() % 400), 1));
  }
  for (int i = 0; i < 10000; ++i) {
    const size_t before = h.decided.size();
    h.one();
    ASSERT_EQ(h.decided.size(), before + 1);
    h.queue.finished(h.decided.back().first);
  }
  const double ratio =
      static_cast<double>(h.served["heavy"]) / static_cast<double>(h.served["light"]);
  EXPECT_NEAR(ratio, 3.0, 0.15) << h.served["heavy"] << " / " << h.served["light"];
}

TEST(AdmissionQueue, EqualWeightsAlternateAndInsideATenantFirstComeFirstServed) {
  Harness h;
  for (int i = 0; i < 3; ++i) h.submit(request("a", 10));
  h.submit(request("b", 10));
  h.queue.pump(h.now);
  ASSERT_EQ(h.decided.size(), 4u);
  EXPECT_EQ(h.decided[0].first, "a");
  EXPECT_EQ(h.decided[1].first, "b");  // b's tag 0 beats a's second (10)
  EXPECT_EQ(h.decided[2].first, "a");
  EXPECT_EQ(h.decided[3].first, "a");
}

TEST(AdmissionQueue, AHigherClassAlwaysGoesFirst) {
  Harness h;
  for (int i = 0; i < 5; ++i) h.submit(request("batch", 1, 100, 1, "batch"));
  for (int i = 0; i < 5; ++i) h.submit(request("live", 1000, 1, 2, "interactive"));
  h.queue.pump(h.now);
  ASSERT_EQ(h.decided.size(), 10u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(h.decided[i].first, "live") << i;
  for (int i = 5; i < 10; ++i) EXPECT_EQ(h.decided[i].first, "batch") << i;
  const auto depths = h.queue.depths();
  EXPECT_EQ(depths.at({"interactive", "live"}), 0);
  EXPECT_EQ(h.queue.waits().at("batch").count, 5u);
}

TEST(AdmissionQueue, AClosedGateHoldsEveryoneAndAnOpenOneLetsThemGoInOrder) {
  Harness h;
  h.open = false;
  h.submit(request("a", 10));
  h.submit(request("b", 10, 1, 5, "gold"));
  h.queue.pump(h.now);
  EXPECT_TRUE(h.decided.empty());
  EXPECT_EQ(h.queue.queued(), 2u);
  h.open = true;
  h.queue.pump(h.now);
  ASSERT_EQ(h.decided.size(), 2u);
  EXPECT_EQ(h.decided[0].first, "b");
}

TEST(AdmissionQueue, RequestsPastMaxConcurrencyWaitAndLetOthersGo) {
  Harness h;
  for (int i = 0; i < 3; ++i) {
    AdmissionRequest r = request("capped", 10);
    r.max_concurrency = 1;
    h.submit(r);
  }
  h.submit(request("free", 10));
  h.queue.pump(h.now);
  ASSERT_EQ(h.decided.size(), 2u);  // one of capped's, and free's
  EXPECT_EQ(h.queue.queued(), 2u);
  h.queue.finished("capped");
  h.queue.pump(h.now);
  EXPECT_EQ(h.decided.size(), 3u);
  EXPECT_EQ(h.decided.back().first, "capped");
}

TEST(AdmissionQueue, MaxQueuedIsRefusedAtOnce) {
  Harness h;
  h.open = false;
  for (int i = 0; i < 3; ++i) {
    AdmissionRequest r = request("a", 10);
    r.max_queued = 2;
    h.submit(r);
  }
  ASSERT_EQ(h.decided.size(), 1u);
  EXPECT_FALSE(h.decided[0].second.dispatched);
  EXPECT_EQ(h.decided[0].second.reason, "queue_full");
  EXPECT_GE(h.decided[0].second.retry_after_s, 1);
  EXPECT_EQ(h.queue.queued(), 2u);
}

TEST(AdmissionQueue, PastTheDeadlineIs429WithTheEstimatedQueueTime) {
  Harness h;
  // 10 requests of 100 tokens go in the first second: 1000 tokens/s.
  for (int i = 0; i < 10; ++i) h.submit(request("a", 100));
  h.queue.pump(h.now);
  ASSERT_EQ(h.decided.size(), 10u);
  h.now += 1s;
  // The gate closes; 3000 tokens queue in this class, 2000 in a higher one,
  // 50000 in a lower one (not ahead of it).
  h.open = false;
  AdmissionRequest mine = request("a", 1000);
  mine.queue_deadline = 500ms;
  h.submit(mine);
  for (int i = 0; i < 2; ++i) h.submit(request("b", 1000));
  h.submit(request("vip", 2000, 1, 5, "gold"));
  h.submit(request("low", 50000, 1, -1, "spare"));
  h.now += 499ms;
  h.queue.pump(h.now);
  EXPECT_EQ(h.decided.size(), 10u);  // not yet
  h.now += 1ms;
  h.queue.pump(h.now);
  ASSERT_EQ(h.decided.size(), 11u);
  const AdmissionDecision& d = h.decided.back().second;
  EXPECT_FALSE(d.dispatched);
  EXPECT_EQ(d.reason, "deadline");
  // 5000 tokens ahead at 1000 tokens per 1.5 s (the window since the first
  // dispatch): 7.5 s, rounded up.
  EXPECT_EQ(d.retry_after_s, 8);
  EXPECT_NEAR(d.waited_s, 0.5, 1e-9);
  // Without any dispatch in the last 10 s: the deadline, at least 1 s;
  // and a huge queue is clamped to 60 s.
  Harness idle;
  idle.open = false;
  AdmissionRequest r = request("a", 10);
  r.queue_deadline = 2500ms;
  idle.submit(r);
  idle.now += 3s;
  idle.queue.pump(idle.now);
  ASSERT_EQ(idle.decided.size(), 1u);
  EXPECT_EQ(idle.decided[0].second.retry_after_s, 3);
  h.now += 1s;
  AdmissionRequest big = request("a", 10'000'000);
  big.queue_deadline = 1ms;
  h.submit(big);
  h.now += 1ms;
  h.queue.pump(h.now);
  EXPECT_EQ(h.decided.back().second.retry_after_s, 60);
}

TEST(AdmissionQueue, ACancelledRequestIsNeverDecided) {
  AdmissionQueue queue;
  const auto now = Clock::now();
  AdmissionRequest r = request("a", 10);
  r.ready = [] { return false; };
  AdmissionQueue::Id id = 0;
  bool called = false;
  ASSERT_FALSE(queue.submit(
      r, now, [&](const AdmissionDecision&) { called = true; }, &id));
  EXPECT_TRUE(queue.cancel(id));
  EXPECT_FALSE(queue.cancel(id));
  queue.pump(now + 1h);
  EXPECT_FALSE(called);
  EXPECT_EQ(queue.queued(), 0u);
}

}  // namespace
}  // namespace basalt::router
