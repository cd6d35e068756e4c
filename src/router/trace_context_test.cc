// W3C traceparent: what is valid, a client's trace kept, a new one started,
// a new parent-id per attempt.
#include "router/trace_context.h"

#include <gtest/gtest.h>

#include <set>

namespace basalt::router {
namespace {

constexpr const char* kClient = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(TraceContext, ValidTraceparents) {
  EXPECT_TRUE(valid_traceparent(kClient));
  // A later version by its first four fields, with or without more.
  EXPECT_TRUE(valid_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
  EXPECT_TRUE(valid_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"));
  for (const char* bad : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  // 00 has no more
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",        // version ff
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",        // zero trace-id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",        // zero parent-id
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",        // upper case
           "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",         // short id
           "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
           "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
           "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
       })
    EXPECT_FALSE(valid_traceparent(bad)) << bad;
}

TEST(TraceContext, AClientsTraceIsKeptWithItsState) {
  const TraceContext t = trace_of(kClient, "vendor=abc,other=1");
  EXPECT_TRUE(t.from_client);
  EXPECT_EQ(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(t.flags, "01");
  EXPECT_EQ(t.tracestate, "vendor=abc,other=1");
  // Each attempt: the same trace and flags, a new parent-id, never the client's.
  std::set<std::string> parents;
  for (int i = 0; i < 50; ++i) {
    const std::string p = attempt_traceparent(t);
    ASSERT_TRUE(valid_traceparent(p)) << p;
    EXPECT_EQ(p.substr(0, 36), "00-4bf92f3577b34da6a3ce929d0e0e4736-");
    EXPECT_EQ(p.substr(52), "-01");
    EXPECT_NE(p.substr(36, 16), "00f067aa0ba902b7");
    parents.insert(p.substr(36, 16));
  }
  EXPECT_EQ(parents.size(), 50u);
}

TEST(TraceContext, AnAbsentOrInvalidTraceparentStartsANewTrace) {
  const TraceContext a = trace_of(std::nullopt, std::nullopt);
  const TraceContext b = trace_of("00-nonsense", "vendor=abc");
  for (const TraceContext* t : {&a, &b}) {
    EXPECT_FALSE(t->from_client);
    EXPECT_EQ(t->flags, "00");
    EXPECT_TRUE(t->tracestate.empty());  // dropped with the invalid traceparent
    EXPECT_TRUE(valid_traceparent(attempt_traceparent(*t))) << attempt_traceparent(*t);
  }
  EXPECT_NE(a.trace_id, b.trace_id);
  // A tracestate past 512 bytes is not passed on.
  EXPECT_TRUE(trace_of(kClient, std::string(513, 'a')).tracestate.empty());
}

}  // namespace
}  // namespace basalt::router
