// DnsDiscovery with a stub resolver: targets parsed with their labels, the
// registry diffed as a SIGHUP reload does (a vanished address drains, a new
// one joins, an unchanged answer publishes nothing), a failed resolution
// keeping the last addresses, an empty answer emptying the pool, and the
// fixed replicas merged in; the system resolver on names that need no DNS
// server.
#include "router/dns_discovery.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/error.h"
#include "testing/error_test_util.h"

namespace basalt::router {
namespace {

using testing::error_of;

class StubResolver : public AddressResolver {
 public:
  std::vector<std::string> resolve(const std::string& host) override {
    ++calls;
    if (failing.count(host) != 0) fail("the name server did not answer for {}", host);
    const auto found = answers.find(host);
    return found == answers.end() ? std::vector<std::string>{} : found->second;
  }
  std::map<std::string, std::vector<std::string>> answers;
  std::set<std::string> failing;
  int calls = 0;
};

std::vector<std::string> ids_of(const ReplicaRegistry& registry) {
  std::vector<std::string> ids;
  for (const Replica& r : registry.snapshot()->replicas) ids.push_back(r.spec.id);
  return ids;
}

TEST(DnsDiscovery, ParsesHostPortAndLabels) {
  const DnsTarget t =
      parse_dns_target("mini-engine.serving.svc:8000 pool=mini region=eu", "--replica-dns");
  EXPECT_EQ(t.host, "mini-engine.serving.svc");
  EXPECT_EQ(t.port, "8000");
  EXPECT_EQ(t.labels.pool, "mini");
  EXPECT_EQ(t.labels.region, "eu");
  EXPECT_EQ(t.text, "mini-engine.serving.svc:8000 pool=mini region=eu");
  for (const char* bad : {"", "engine.svc", "engine.svc:", "http://engine.svc:8000",
                          "engine.svc:8000/v1", "engine.svc:port", "engine.svc:8000 colour=red"}) {
    SCOPED_TRACE(bad);
    EXPECT_NE(error_of([&] { parse_dns_target(bad, "--replica-dns"); }).find("--replica-dns"),
              std::string::npos);
  }
}

TEST(DnsDiscovery, PublishesTheResolvedAddressesAfterTheFixedReplicas) {
  ReplicaRegistry registry;
  StubResolver dns;
  dns.answers["engine.svc"] = {"10.0.0.7", "10.0.0.5", "10.0.0.7"};
  DnsDiscovery discovery(registry, dns, {parse_dns_target("engine.svc:8000 pool=p", "t")});
  discovery.set_fixed({parse_replica("http://fixed:9000", "t")});
  EXPECT_EQ(ids_of(registry), (std::vector<std::string>{"http://fixed:9000"}));
  const RefreshResult r = discovery.refresh();
  EXPECT_TRUE(r.changed);
  EXPECT_TRUE(r.failures.empty());
  // Sorted, each once, with the target's port and labels.
  EXPECT_EQ(ids_of(registry), (std::vector<std::string>{"http://fixed:9000", "http://10.0.0.5:8000",
                                                        "http://10.0.0.7:8000"}));
  EXPECT_EQ(registry.snapshot()->replicas[1].spec.pool, "p");
  EXPECT_EQ(registry.snapshot()->replicas[0].spec.pool, "");
  EXPECT_EQ(discovery.listed(), ids_of(registry));
}

TEST(DnsDiscovery, DiffsTheRegistryAsAReloadDoes) {
  ReplicaRegistry registry;
  StubResolver dns;
  dns.answers["engine.svc"] = {"10.0.0.1", "10.0.0.2"};
  DnsDiscovery discovery(registry, dns, {parse_dns_target("engine.svc:8000", "t")});
  ASSERT_TRUE(discovery.refresh().changed);
  const uint64_t generation = registry.snapshot()->generation;
  const std::shared_ptr<ReplicaState> kept = registry.snapshot()->replicas[0].state;
  const std::shared_ptr<ReplicaState> gone = registry.snapshot()->replicas[1].state;
  kept->in_flight.store(3);

  // The same answer: nothing is published.
  EXPECT_FALSE(discovery.refresh().changed);
  EXPECT_EQ(registry.snapshot()->generation, generation);

  // 10.0.0.2 vanished, 10.0.0.3 appeared: the one drains, the other joins,
  // and the one still there keeps its state.
  dns.answers["engine.svc"] = {"10.0.0.3", "10.0.0.1"};
  EXPECT_TRUE(discovery.refresh().changed);
  EXPECT_EQ(registry.snapshot()->generation, generation + 1);
  EXPECT_EQ(ids_of(registry),
            (std::vector<std::string>{"http://10.0.0.1:8000", "http://10.0.0.3:8000"}));
  EXPECT_TRUE(gone->draining.load());
  EXPECT_EQ(registry.snapshot()->replicas[0].state, kept);
  EXPECT_EQ(kept->in_flight.load(), 3);
  EXPECT_FALSE(kept->draining.load());
}

TEST(DnsDiscovery, AFailedLookupKeepsTheLastAddressesAndAnEmptyAnswerEmptiesThePool) {
  ReplicaRegistry registry;
  StubResolver dns;
  dns.answers["a.svc"] = {"10.0.0.1"};
  dns.answers["b.svc"] = {"fd00::2"};
  DnsDiscovery discovery(
      registry, dns,
      {parse_dns_target("a.svc:8000 pool=a", "t"), parse_dns_target("b.svc:8001 pool=b", "t")});
  discovery.refresh();
  EXPECT_EQ(ids_of(registry),
            (std::vector<std::string>{"http://10.0.0.1:8000", "http://[fd00::2]:8001"}));

  dns.failing.insert("a.svc");
  dns.answers["b.svc"] = {"fd00::3"};
  const RefreshResult r = discovery.refresh();
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_NE(r.failures[0].find("a.svc: the name server did not answer"), std::string::npos)
      << r.failures[0];
  EXPECT_EQ(ids_of(registry),
            (std::vector<std::string>{"http://10.0.0.1:8000", "http://[fd00::3]:8001"}));

  // Scaled to zero: no records at all, and the registry may be empty.
  dns.failing.clear();
  dns.answers.clear();
  EXPECT_TRUE(discovery.refresh().changed);
  EXPECT_TRUE(registry.snapshot()->replicas.empty());
  dns.answers["a.svc"] = {"10.0.0.9"};
  EXPECT_TRUE(discovery.refresh().changed);
  EXPECT_EQ(ids_of(registry), (std::vector<std::string>{"http://10.0.0.9:8000"}));
}

TEST(DnsDiscovery, AReloadOfTheFixedReplicasKeepsTheResolvedOnes) {
  ReplicaRegistry registry;
  StubResolver dns;
  dns.answers["engine.svc"] = {"10.0.0.1"};
  DnsDiscovery discovery(registry, dns, {parse_dns_target("engine.svc:8000", "t")});
  discovery.refresh();
  // An address listed as a fixed replica too is listed once, as the fixed one.
  discovery.set_fixed(
      {parse_replica("http://10.0.0.1:8000 region=eu", "t"), parse_replica("http://x:1", "t")});
  EXPECT_EQ(ids_of(registry), (std::vector<std::string>{"http://10.0.0.1:8000", "http://x:1"}));
  EXPECT_EQ(registry.snapshot()->replicas[0].spec.region, "eu");
  discovery.set_fixed({});
  EXPECT_EQ(ids_of(registry), (std::vector<std::string>{"http://10.0.0.1:8000"}));
  EXPECT_NE(
      error_of([&] {
        discovery.set_fixed({parse_replica("http://x:1", "t"), parse_replica("http://X:1", "t")});
      }).find("listed twice"),
      std::string::npos);
  EXPECT_EQ(ids_of(registry), (std::vector<std::string>{"http://10.0.0.1:8000"}));
}

TEST(DnsDiscovery, TheSystemResolverAnswersForLiteralsAndLocalhost) {
  AsioAddressResolver resolver;
  EXPECT_EQ(resolver.resolve("127.0.0.1"), (std::vector<std::string>{"127.0.0.1"}));
  EXPECT_EQ(resolver.resolve("::1"), (std::vector<std::string>{"::1"}));
  const std::vector<std::string> local = resolver.resolve("localhost");
  EXPECT_FALSE(local.empty());
  for (const std::string& a : local) EXPECT_TRUE(a == "127.0.0.1" || a == "::1") << a;
}

}  // namespace
}  // namespace basalt::router
