// Tenants: the file, keys, limits on a test clock, cache namespaces; and
// through the gateway.
#include "router/tenants.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace basalt::router {
namespace {

using namespace std::chrono_literals;

const char* kFile = R"({
  "classes": {"interactive": {"priority": 2}, "batch": {"priority": -1}},
  "tenants": {
    "acme": {"keys": ["sk-acme-1", "sk-acme-2"], "class": "interactive",
             "limits": {"rps": 2, "burst": 3, "max_concurrency": 2}},
    "globex": {"keys": ["sk-globex"], "class": "batch", "share_cache": true}
  }})";

TEST(Tenants, ParsesAFileAndFindsTenantsByKey) {
  const std::vector<Tenant> t = parse_tenants(kFile, "tenants.json");
  ASSERT_EQ(t.size(), 2u);
  TenantBook book;
  book.set(t);
  EXPECT_EQ(book.find("sk-acme-2")->name, "acme");
  EXPECT_EQ(book.find("sk-acme-2")->priority, 2);
  EXPECT_EQ(book.find("sk-globex")->priority, -1);
  EXPECT_FALSE(book.find("sk-acme-3"));
  EXPECT_FALSE(book.find(""));
  EXPECT_EQ(TenantBook::cache_salt(*book.find("sk-acme-1"), ""), "t:acme");
  EXPECT_EQ(TenantBook::cache_salt(*book.find("sk-acme-1"), "mine"), "t:acme/mine");
}

TEST(Tenants, ABadFileNamesTheFieldAndNeverAKey) {
  const auto error = [](const char* text) {
    try {
      parse_tenants(text, "t.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(R"({"tenants": {"a": {"keys": ["k"], "limits": {"rps": -1}}}})").find("tenants.a.limits.rps"),
            std::string::npos);
  EXPECT_NE(error(R"({"tenants": {"a": {"keys": ["k"], "klass": "x"}}})").find("tenants.a.klass"), std::string::npos);
  EXPECT_NE(error(R"({"tenants": {"a": {"keys": ["k"], "class": "gold"}}})").find("tenants.a.class"),
            std::string::npos);
  const std::string twice = error(R"({"tenants": {"a": {"keys": ["secret-1"]}, "b": {"keys": ["secret-1"]}}})");
  EXPECT_NE(twice.find("given twice"), std::string::npos) << twice;
  EXPECT_EQ(twice.find("secret-1"), std::string::npos) << twice;
  EXPECT_NE(error(R"({"tenants": {}})").find("at least one tenant"), std::string::npos);
  EXPECT_NE(error("not json").find("t.json: not JSON"), std::string::npos);
  EXPECT_NE(error(R"({"tenants": {"a b": {"keys": ["k"]}}})").find("tenant names"), std::string::npos);
}

TEST(Tenants, ARateBucketAndAConcurrencyLimit) {
  TenantBook book;
  book.set(parse_tenants(kFile, "t"));
  auto t = TenantBook::Clock::now();
  // Concurrency 2: a third waits for a release.
  ASSERT_TRUE(book.admit("acme", t).admitted);
  ASSERT_TRUE(book.admit("acme", t).admitted);
  const auto busy = book.admit("acme", t);
  EXPECT_FALSE(busy.admitted);
  EXPECT_EQ(busy.reason, "concurrency");
  book.release("acme");
  book.release("acme");
  // The bucket holds 3 (burst) and refills 2 a second: one left now.
  ASSERT_TRUE(book.admit("acme", t).admitted);
  book.release("acme");
  const auto limited = book.admit("acme", t);
  EXPECT_FALSE(limited.admitted);
  EXPECT_EQ(limited.reason, "rate");
  EXPECT_EQ(limited.retry_after_s, 1);
  t += 500ms;  // one more token
  ASSERT_TRUE(book.admit("acme", t).admitted);
  book.release("acme");
  // No limits: always.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(book.admit("globex", t).admitted);
  EXPECT_EQ(book.running().at("globex"), 100);
  // A reload keeps the counters.
  book.set(parse_tenants(kFile, "t"));
  EXPECT_EQ(book.running().at("globex"), 100);
}

TEST(Tenants, ClassesWeightsAndQueueLimitsAreReadAndChecked) {
  const std::vector<Tenant> t = parse_tenants(R"({
    "classes": {"interactive": {"priority": 2, "queue_deadline_ms": 2000, "ttft_slo_ms": 1500},
                "spare": {"priority": 0, "sheddable": true}},
    "tenants": {"acme": {"keys": ["k1"], "class": "interactive", "weight": 3,
                         "limits": {"tokens_per_min": 6000, "max_queued": 8}},
                "idle": {"keys": ["k2"], "class": "spare"},
                "plain": {"keys": ["k3"]}}})",
                                              "t");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].queue_deadline_ms, 2000);
  EXPECT_EQ(t[0].ttft_slo_ms, 1500);
  EXPECT_EQ(t[0].weight, 3);
  EXPECT_EQ(t[0].limits.tokens_per_min, 6000);
  EXPECT_EQ(t[0].limits.max_queued, 8);
  EXPECT_FALSE(t[0].sheddable);
  EXPECT_TRUE(t[1].sheddable);
  EXPECT_EQ(t[1].queue_deadline_ms, 60000);  // the gateway's default
  EXPECT_EQ(t[2].class_name, "default");
  EXPECT_EQ(t[2].weight, 1);
  const auto error = [](const std::string& text) {
    try {
      parse_tenants(text, "t.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto tenant_with = [](const std::string& fields) {
    return R"({"tenants": {"a": {"keys": ["k"], )" + fields + "}}}";
  };
  EXPECT_NE(error(tenant_with(R"("weight": 0)")).find("tenants.a.weight"), std::string::npos);
  EXPECT_NE(error(tenant_with(R"("weight": "3")")).find("tenants.a.weight"), std::string::npos);
  EXPECT_NE(error(tenant_with(R"("weight": 1e9)")).find("tenants.a.weight"), std::string::npos);
  EXPECT_NE(error(tenant_with(R"("limits": {"tokens_per_min": -5})")).find("tenants.a.limits.tokens_per_min"),
            std::string::npos);
  EXPECT_NE(error(tenant_with(R"("limits": {"max_queued": 1.5})")).find("tenants.a.limits.max_queued"),
            std::string::npos);
  EXPECT_NE(error(tenant_with(R"("limits": {"max_queued": 0})")).find("tenants.a.limits.max_queued"),
            std::string::npos);
  const auto class_with = [](const std::string& fields) {
    return R"({"classes": {"c": {)" + fields + R"(}}, "tenants": {"a": {"keys": ["k"], "class": "c"}}})";
  };
  EXPECT_NE(error(class_with(R"("queue_deadline_ms": 0)")).find("classes.c.queue_deadline_ms"), std::string::npos);
  EXPECT_NE(error(class_with(R"("queue_deadline_ms": 2.5)")).find("classes.c.queue_deadline_ms"), std::string::npos);
  EXPECT_NE(error(class_with(R"("ttft_slo_ms": -1)")).find("classes.c.ttft_slo_ms"), std::string::npos);
  EXPECT_NE(error(class_with(R"("sheddable": 1)")).find("classes.c.sheddable"), std::string::npos);
  EXPECT_NE(error(class_with(R"("weight": 1)")).find("classes.c.weight"), std::string::npos);
}

TEST(Tenants, ATokenBucketChargedAtAdmissionAndRefundedAtTheEnd) {
  TenantBook book;
  book.set(parse_tenants(R"({"tenants": {"a": {"keys": ["k"], "limits": {"tokens_per_min": 600,
                                                                          "max_concurrency": 1}}}})",
                         "t"));
  auto t = TenantBook::Clock::now();
  // 600 a minute: 10 a second, 600 at most. Queued requests skip the
  // concurrency limit (the queue applies it) and run from started().
  ASSERT_TRUE(book.admit("a", t, 400, true).admitted);
  ASSERT_TRUE(book.admit("a", t, 150, true).admitted);
  EXPECT_EQ(book.running().at("a"), 0);
  const auto refused = book.admit("a", t, 100, true);  // 50 left
  EXPECT_FALSE(refused.admitted);
  EXPECT_EQ(refused.reason, "tokens");
  EXPECT_EQ(refused.retry_after_s, 5);  // 50 more at 10 a second
  // The first used 120 of its 400: 280 back, so 330 now.
  book.refund("a", 280);
  ASSERT_TRUE(book.admit("a", t, 300, true).admitted);
  EXPECT_FALSE(book.admit("a", t, 100, true).admitted);  // 30 left
  t += 7s;                                                 // +70
  ASSERT_TRUE(book.admit("a", t, 100, true).admitted);
  // Refunds never fill past a minute's tokens.
  book.refund("a", 100000);
  ASSERT_TRUE(book.admit("a", t, 600, true).admitted);
  EXPECT_FALSE(book.admit("a", t, 1, true).admitted);
  // A request larger than a minute's tokens passes once the bucket is full.
  t += 60s;
  ASSERT_TRUE(book.admit("a", t, 5000, true).admitted);
  const auto after_big = book.admit("a", t, 1, true);
  EXPECT_FALSE(after_big.admitted);
  EXPECT_EQ(after_big.retry_after_s, 60);  // clamped
  // Not queued: the concurrency limit holds as before.
  t += 3600s;
  ASSERT_TRUE(book.admit("a", t, 1).admitted);
  EXPECT_EQ(book.admit("a", t, 1).reason, "concurrency");
  book.release("a");
  book.started("a");
  EXPECT_EQ(book.running().at("a"), 1);
}

}  // namespace
}  // namespace basalt::router

namespace basalt::router {
namespace {

TEST(Tenants, RegionsPoolAndOverflowPoolsAreReadAndChecked) {
  const std::vector<Tenant> t = parse_tenants(R"({"tenants": {
      "acme": {"keys": ["k1"], "regions": ["eu", "ch"], "pool": "eu-a", "overflow_pools": ["eu-b", "ch-a"]},
      "plain": {"keys": ["k2"]}}})",
                                              "t");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].regions, (std::vector<std::string>{"eu", "ch"}));
  EXPECT_EQ(t[0].pool, "eu-a");
  EXPECT_EQ(t[0].overflow_pools, (std::vector<std::string>{"eu-b", "ch-a"}));
  EXPECT_TRUE(t[1].regions.empty());
  EXPECT_TRUE(t[1].pool.empty());
  EXPECT_TRUE(t[1].overflow_pools.empty());
  const auto error = [](const std::string& fields) {
    try {
      parse_tenants(R"({"tenants": {"a": {"keys": ["k"], )" + fields + "}}}", "t.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto expect = [&](const std::string& fields, const std::string& says) {
    const std::string e = error(fields);
    EXPECT_NE(e.find(says), std::string::npos) << fields << " -> " << e;
  };
  expect(R"("regions": [])", "t.json: tenants.a.regions must be a list of 1 to");
  expect(R"("regions": "eu")", "tenants.a.regions must be a list");
  expect(R"("regions": ["eu", "e u"])", "tenants.a.regions[1] must be a name");
  expect(R"("regions": ["eu", 3])", "tenants.a.regions[1] must be a name");
  expect(R"("regions": ["eu", "eu"])", "tenants.a.regions[1] is given twice");
  expect(R"("pool": "")", "tenants.a.pool must be a name");
  expect(R"("pool": ["a"])", "tenants.a.pool must be a name");
  expect(R"("overflow_pools": {"b": 1})", "tenants.a.overflow_pools must be a list");
  expect(R"("overflow_pools": ["b", "b"])", "tenants.a.overflow_pools[1] is given twice");
  expect(R"("pool": "a", "overflow_pools": ["b", "a"])", "tenants.a.overflow_pools[1] is the tenant's own pool");
  expect(R"("zone": "x")", "tenants.a.zone is not a known field");
  // An empty overflow list is allowed (no overflow).
  EXPECT_EQ(error(R"("pool": "a", "overflow_pools": [])"), "no error");
}

}  // namespace
}  // namespace basalt::router
