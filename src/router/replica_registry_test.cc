// The replica list: parsing (flags and files, errors that say where),
// identity by canonical URL, snapshots that never change once handed out,
// and per-replica state that survives reloads (draining when removed).
#include "router/replica_registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/error.h"

namespace basalt::router {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ReplicaRegistry, ParsesReplicasAndSaysWhereOneIsWrong) {
  const ReplicaSpec a = parse_replica("HTTP://Node-A:8000/v1/  region=eu-west pool=gpu model=llama", "--replica");
  EXPECT_EQ(a.id, "http://node-a:8000/v1");
  EXPECT_EQ(a.region, "eu-west");
  EXPECT_EQ(a.pool, "gpu");
  EXPECT_EQ(a.model, "llama");
  EXPECT_EQ(parse_replica("http://a", "x").id, "http://a:80");
  EXPECT_EQ(parse_replica("http://a:80/", "x").id, parse_replica("http://A", "x").id);
  EXPECT_EQ(parse_replica("https://[::1]:9000", "x").id, "https://[::1]:9000");

  const struct {
    const char* text;
    const char* says;
  } bad[] = {
      {"", "expected URL"},
      {"node-a:8000", "http://HOST"},
      {"http://a zone=x", "unknown label 'zone'"},
      {"http://a region", "not key=value"},
      {"http://a region=", "has no value"},
      {"http://a region=x region=y", "given twice"},
      {"http://a =x", "not key=value"},
  };
  for (const auto& b : bad) {
    const std::string e = error_of([&] { parse_replica(b.text, "--replica"); });
    EXPECT_NE(e.find(b.says), std::string::npos) << b.text << ": " << e;
    EXPECT_NE(e.find("--replica"), std::string::npos) << e;
  }

  const std::vector<ReplicaSpec> file = parse_replica_file(
      "# the fleet\n\nhttp://a:1 region=us   # first\n  http://b:2 pool=big\n#http://c:3\n", "replicas.txt");
  ASSERT_EQ(file.size(), 2u);
  EXPECT_EQ(file[0].id, "http://a:1");
  EXPECT_EQ(file[0].region, "us");
  EXPECT_EQ(file[1].pool, "big");
  const std::string e = error_of([] { parse_replica_file("http://a:1\n\nhttp://b:2 colour=red\n", "replicas.txt"); });
  EXPECT_NE(e.find("replicas.txt:3"), std::string::npos) << e;
}

TEST(ReplicaRegistry, SnapshotsStayAsHandedOutAndStateSurvivesReloads) {
  ReplicaRegistry registry;
  EXPECT_EQ(registry.snapshot()->generation, 0u);
  EXPECT_TRUE(registry.snapshot()->replicas.empty());
  EXPECT_NE(error_of([&] { registry.set({}); }).find("no replicas"), std::string::npos);
  const auto spec = [](const char* text) { return parse_replica(text, "test"); };
  EXPECT_NE(error_of([&] { registry.set({spec("http://a"), spec("http://A:80/")}); }).find("listed twice"),
            std::string::npos);
  EXPECT_EQ(registry.snapshot()->generation, 0u);  // a failed set() changes nothing

  registry.set({spec("http://a"), spec("http://b")});
  const std::shared_ptr<const Snapshot> first = registry.snapshot();
  ASSERT_EQ(first->generation, 1u);
  ASSERT_EQ(first->replicas.size(), 2u);
  const std::shared_ptr<ReplicaState> a = first->find("http://a:80")->state;
  const std::shared_ptr<ReplicaState> b = first->find("http://b:80")->state;
  a->in_flight = 3;

  registry.set({spec("http://a region=eu"), spec("http://c")});
  const std::shared_ptr<const Snapshot> second = registry.snapshot();
  EXPECT_EQ(second->generation, 2u);
  EXPECT_EQ(first->replicas.size(), 2u);                 // unchanged
  EXPECT_NE(first->find("http://b:80"), nullptr);        // still there for its holders
  EXPECT_EQ(second->find("http://b:80"), nullptr);       // gone from the list
  EXPECT_TRUE(b->draining.load());                       // no new requests
  EXPECT_EQ(second->find("http://a:80")->state, a);      // same state
  EXPECT_EQ(second->find("http://a:80")->state->in_flight.load(), 3);
  EXPECT_EQ(second->find("http://a:80")->spec.region, "eu");
  EXPECT_FALSE(a->draining.load());

  registry.set({spec("http://b")});  // back: its state, no longer draining
  EXPECT_EQ(registry.snapshot()->find("http://b:80")->state, b);
  EXPECT_FALSE(b->draining.load());
  EXPECT_TRUE(a->draining.load());
}

TEST(ReplicaRegistry, ReadersAndReloadsRunTogether) {
  ReplicaRegistry registry;
  const auto spec = [](const std::string& text) { return parse_replica(text, "test"); };
  registry.set({spec("http://a")});
  std::atomic<bool> stop{false};
  std::atomic<int64_t> bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t)
    readers.emplace_back([&] {
      while (!stop) {
        const std::shared_ptr<const Snapshot> s = registry.snapshot();
        // Every snapshot is whole: generation g lists g replicas.
        if (s->replicas.size() != s->generation) ++bad;
        for (const Replica& r : s->replicas) r.state->in_flight.fetch_add(1);
      }
    });
  for (int g = 2; g <= 200; ++g) {
    std::vector<ReplicaSpec> specs;
    for (int i = 0; i < g; ++i) specs.push_back(spec("http://r" + std::to_string(i)));
    registry.set(std::move(specs));
  }
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(registry.snapshot()->replicas.size(), 200u);
}

// `basalt route --breaker-*`: every replica's breaker, listed at first or
// on a reload, opens, waits and closes as the registry's options say.
TEST(ReplicaRegistry, EveryReplicasBreakerTakesTheRegistrysOptions) {
  BreakerOptions options;
  options.failures_to_open = 1;
  options.open_for = std::chrono::milliseconds(500);
  options.successes_to_close = 3;
  ReplicaRegistry registry(options);
  registry.set({parse_replica("http://a", "test")});
  registry.set({parse_replica("http://a", "test"), parse_replica("http://b", "test")});
  const auto t0 = CircuitBreaker::Clock::now();
  for (const Replica& r : registry.snapshot()->replicas) {
    CircuitBreaker& b = r.state->breaker;
    b.failure(t0);  // one is enough
    EXPECT_EQ(b.state(t0), CircuitBreaker::State::kOpen) << r.spec.id;
    EXPECT_EQ(b.state(t0 + std::chrono::milliseconds(499)), CircuitBreaker::State::kOpen) << r.spec.id;
    const auto later = t0 + std::chrono::milliseconds(500);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(b.state(later), CircuitBreaker::State::kHalfOpen) << r.spec.id << " " << i;
      ASSERT_TRUE(b.acquire(later));
      b.success(later);
    }
    EXPECT_EQ(b.state(later), CircuitBreaker::State::kClosed) << r.spec.id;
  }
  // The defaults: five failures in a row.
  ReplicaRegistry plain;
  plain.set({parse_replica("http://a", "test")});
  CircuitBreaker& b = plain.snapshot()->replicas[0].state->breaker;
  for (int i = 0; i < 4; ++i) b.failure(t0);
  EXPECT_EQ(b.state(t0), CircuitBreaker::State::kClosed);
  b.failure(t0);
  EXPECT_EQ(b.state(t0), CircuitBreaker::State::kOpen);
}

}  // namespace
}  // namespace basalt::router
