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

}  // namespace
}  // namespace basalt::router
